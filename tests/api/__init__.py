"""The api function: routes, validation, owners, idempotency, the OpenAPI contract."""
