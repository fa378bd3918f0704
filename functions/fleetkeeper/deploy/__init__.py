"""What CloudFormation runs while it deploys the stack: checks of the stack's parameters that a
template's Rules cannot express (`zone_check`: the load balancer's zones cover the replicas').
"""
