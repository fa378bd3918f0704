"""The cleanup function: deletes a removed service incarnation's versions and replicas (DynamoDB stream)."""
