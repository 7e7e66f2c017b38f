"""flowrt.deploy: running a bundle as processes: the replica process (`worker`), the gateway's
remote bindings (`remote`), the sockets between processes for calls spread over them
(`peers`), the `local` supervisor, the `ray` launcher, serving (`serving`) and
`python -m BUNDLE` (`entry`).

`open_deployment(path, deploy=...)` is the one entry point (`launch`): `inproc` opens the
embedded runtime, `local` and `ray` start the replicas elsewhere and give the same `Runtime`
whose roles are proxies. It may import everything else in flowrt; nothing in flowrt imports it
(the CLI does; the gateway gets a deployment's statistics through the object it is given).
"""

from flowrt.deploy.launch import DeployError, Deployment, open_deployment, parse_deploy

__all__ = ["DeployError", "Deployment", "open_deployment", "parse_deploy"]
