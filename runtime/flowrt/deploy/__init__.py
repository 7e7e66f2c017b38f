"""flowrt.deploy: running a bundle as processes: the replica process (`worker`), the gateway's
remote bindings (`remote`), the `local` supervisor and the `ray` launcher.

`open_runtime(path, deploy=...)` is the one entry point: `inproc` opens the embedded runtime,
`local` and `ray` start the replicas elsewhere and give the same `Runtime` whose roles are
proxies. It may import everything else in flowrt; nothing in flowrt imports it but the CLI and
the gateway.
"""

from flowrt.deploy.launch import DeployError, Deployment, open_deployment, parse_deploy

__all__ = ["DeployError", "Deployment", "open_deployment", "parse_deploy"]
