"""Wake from zero: demand as a rate (`demand`), the wake target's work per request (`target`) and
its Lambda handler behind the ALB (`handler`).
"""
