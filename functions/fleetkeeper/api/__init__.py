"""The api function: HTTPS API over the service commands."""
