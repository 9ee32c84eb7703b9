"""``weightgraft explore``: a local web app where a researcher paints a graft (which model serves
each position x layer x component cell) and watches the next-token distribution move.

Modules: ``requests`` (what a client may send, checked), ``guard`` (only the served address and
its own page get through), ``work`` (the bounded line of grafts; a page's superseded strokes are
dropped), ``layout`` (slots grouped into the page's grids), ``anchor`` (painted cells follow
their tokens over a prompt edit), ``session`` (the models and the grafted passes), ``artifacts``
(a run's or a localize run's outputs, read once at start), ``expert_view`` (an expert map
folder, ``--experts``), ``schemes`` (the preset buttons and
the protocols' meanings), ``app`` (the Starlette routes), ``serve`` (uvicorn), ``static/`` (the
page: HTML, CSS and ES modules, all served by the app)."""
