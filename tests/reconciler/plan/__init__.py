"""The planner's table tests: pure, whole action lists."""
