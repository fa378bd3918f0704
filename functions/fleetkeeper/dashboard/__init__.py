"""`fleetkeeper dashboard`: services, replicas, rollouts and traffic in a browser, on 127.0.0.1.

A local web server (aiohttp) that renders HTML from the fleetkeeper API, as the CLI calls it: the
embedded mode's API with its per-run credential, or a deployed stack's signed with the user's own AWS
credentials (`kubectl proxy`'s model: the browser never holds them). Never imported by the Lambda
functions (pyproject's lambda-bundle contract); docs/architecture/dashboard.md describes it.
"""
