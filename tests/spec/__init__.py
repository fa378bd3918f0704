"""The spec, placement, images, task variables, SkyPilot's YAMLs."""
