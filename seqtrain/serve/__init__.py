"""seqtrain-serve: summaries over HTTP, batched across requests.

options.py (ServeConfig: the server's own flags, beside seqtrain-generate's generation flags as defaults) ->
server.py (the program's front end: load and warm the model as seqtrain-generate does, bind, run uvicorn, drain
on SIGTERM/SIGINT) -> app.py (the HTTP routes: /v1/summarize, /healthz, /readyz, /metrics, /docs; limits, errors,
the bearer token) -> requests.py (a request body to texts and search settings, checked as the flags are) ->
batcher.py (the queue and the one worker that batches texts whose search settings agree and runs them through
seqtrain.generation.runner, the path seqtrain-generate takes) -> metrics.py (Prometheus' text format).
"""
