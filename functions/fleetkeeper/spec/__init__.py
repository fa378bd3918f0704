"""The service spec and what it decides before any AWS call: the spec model (`service`), SkyPilot's
fields it does not take, the CLI's YAML errors, placement over the instance catalogue, images and
task variables. Pure: no AWS, no I/O.
"""
