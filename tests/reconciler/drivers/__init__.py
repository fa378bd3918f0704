"""The reconciler's drivers: the ec2 driver against moto."""
