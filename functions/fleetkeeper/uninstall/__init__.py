"""Uninstall: what `sam delete` must remove that CloudFormation never made.

The stack's code makes things at run time that no template resource owns: replica instances, the
owners' replica roles and instance profiles, the services' target groups, listeners and rules, the
load-balancer pools with their wake groups, Route 53 records for services on pools, secret
parameters and workdir objects. Several of them keep template resources from being deleted (an
attached policy, a security group a load balancer uses, a target group a rule forwards to, a bucket
that is not empty), so a stack deleted with them ends DELETE_FAILED.

`UninstallCleanup` (template.yaml) is a custom resource whose Delete runs `cleanup.Uninstall` for the
stack's own identity only (`handler`): docs/architecture/deployment.md, "Uninstall".
"""
