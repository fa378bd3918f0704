"""template.yaml and infra/: translated, linted, evaluated."""
