"""The README's screenshots of ``weightgraft explore`` (docs/explore-*.png): the first page, a
painted FE+LT and a 40-token prompt, at 1500x1000 and 1024x768, on SmolLM2-135M and the demo
finetune with the demo run's table, in Debian's headless Chromium. With ``--localize`` (a
localize run of that pair with ``units: head`` or ``neuron``), also its found set of heads or
neurons applied on its first example (docs/explore-units-*.png).

    OMP_NUM_THREADS=2 python docs/explore_screenshots.py --sft ~/.cache/weightgraft/demo/sft-... \\
        --run runs/demo/run [--localize runs/demo/localize_heads] --out docs
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

LONG = ("Q: In the film that was released last year to wide acclaim in cinemas all over the world, which "
        "actor starred in a movie alongside Keanu Reeves? A: An actor named")  # 41 SmolLM2 tokens
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft", required=True)
    ap.add_argument("--run", default=None)
    ap.add_argument("--localize", default=None, help="a localize run of the pair (units: head or neuron)")
    ap.add_argument("--out", default="docs")
    args = ap.parse_args()

    import uvicorn
    from playwright.sync_api import sync_playwright

    from weightgraft.explore.app import create_app
    from weightgraft.explore.artifacts import LocalizeView, RunView
    from weightgraft.explore.serve import free_port
    from weightgraft.explore.session import Explorer
    from weightgraft.models import load_model

    pre, sft = load_model("smollm2-135m"), load_model(args.sft)
    explorer = Explorer({"pre": pre.model, "sft": sft.model}, pre.tokenizer)
    port = free_port()
    run = RunView(Path(args.run)) if args.run and (Path(args.run) / "summary.csv").is_file() else None
    localize = LocalizeView(Path(args.localize)) if args.localize else None
    server = uvicorn.Server(uvicorn.Config(create_app(explorer, run, localize, address=("127.0.0.1", port)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    out = Path(args.out)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=FLAGS)
        for width, height in ((1500, 1000), (1024, 768)):
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("body[data-ready]", timeout=120000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(out / f"explore-first-{width}.png"))
            ready = page.eval_on_selector("body", "b => b.dataset.ready")
            page.click("#position-schemes button:text-is('FE+LT')")
            page.wait_for_function(f"() => document.body.dataset.ready !== '{ready}'", timeout=120000)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(out / f"explore-fe-lt-{width}.png"))
            page.click("#reset")
            page.fill("#spans", "first_actor=Keanu Reeves")
            page.fill("#prompt", LONG)
            page.wait_for_timeout(4000)
            print(width, "tokens:", page.eval_on_selector_all("#tokens .tok", "t => t.length"),
                  "scroll width:", page.evaluate("document.documentElement.scrollWidth"))
            page.screenshot(path=str(out / f"explore-long-{width}.png"))
            if localize is not None:
                units_set(page, out / f"explore-units-{width}.png")
            page.close()
        browser.close()
    server.should_exit = True


def units_set(page, path: Path) -> None:
    """The localize run's first example with its first found set that holds heads or neurons."""
    page.click("#reset")
    page.click("#localize button:text-is('open example')")
    page.wait_for_timeout(4000)
    button = page.locator("#localize button[title*='unit by unit']").first
    if button.count() == 0:
        print("the localize run has no set of heads or neurons: no", path.name)
        return
    ready = page.eval_on_selector("body", "b => b.dataset.ready")
    button.click()
    page.wait_for_function(f"() => document.body.dataset.ready !== '{ready}'", timeout=120000)
    page.wait_for_timeout(1000)
    page.evaluate("window.scrollTo(0, 0)")  # the grids with the set painted, not the button clicked
    page.wait_for_timeout(300)
    print(path.name, page.inner_text("#graft-line"))
    page.screenshot(path=str(path))


if __name__ == "__main__":
    main()
