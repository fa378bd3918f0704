"""botocore's parsers and their shortcuts."""
