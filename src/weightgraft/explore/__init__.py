"""``weightgraft explore``: a local web app where a researcher paints a graft (which model serves
each position x layer x component cell) and watches the next-token distribution move.

Modules: ``requests`` (what a client may send, checked), ``layout`` (slots grouped into the
page's grids), ``session`` (the models and the grafted passes), ``artifacts`` (a run's or a
localize run's outputs, read once at start), ``app`` (the Starlette routes), ``serve`` (uvicorn),
``static/`` (the page: HTML, CSS and ES modules, all served by the app)."""
