"""Checks on resources: `share gpus with` names a role that owns GPUs, and only once."""

from __future__ import annotations

from collections.abc import Iterator

import networkx as nx

from flowc.check import schema
from flowc.check.checks.fields import unknown_role
from flowc.check.model import Program, RoleInfo
from flowc.check.registry import Check, register
from flowc.diagnostics import Diagnostic, Note
from flowc.syntax import ast


@register
class SharedGpus(Check):
    codes = {
        "E127": "`share` of something other than `gpus`",
        "E160": "`share gpus with` a role that owns no GPUs",
        "E161": "role both owns GPUs and shares another's",
        "E162": "`share gpus with` given twice",
        "E207": "roles share GPUs in a cycle",
    }

    def run(self, program: Program) -> Iterator[Diagnostic]:
        shares = nx.DiGraph((r.name, r.share_target) for r in program.roles.values() if r.share_target in program.roles)
        in_cycle: set[str] = set()
        for cycle in sorted(sorted(c) for c in nx.simple_cycles(shares)):
            in_cycle |= set(cycle)
            roles = sorted((program.roles[name] for name in cycle), key=lambda r: r.shares[0].span.sort_key())
            chain = " → ".join(f"`{r.name}`" for r in roles) + f" → `{roles[0].name}`"
            yield Diagnostic(
                "E207",
                f"roles share GPUs in a cycle: {chain}; none of them owns the cards",
                roles[0].shares[0].span,
                "give one of them `gpus N` and let the others share its cards",
                tuple(Note(r.shares[0].span, f"`{r.name}` shares here") for r in roles[1:]),
            )
        for role in program.roles.values():
            for extra in role.shares[1:]:
                yield Diagnostic(
                    "E162",
                    f"role `{role.name}` shares GPUs more than once",
                    extra.span,
                    "a role shares the cards of one layer-0 role; keep one `share gpus with`",
                    (Note(role.shares[0].span, "first `share` here"),),
                )
            if role.shares and role.name not in in_cycle:
                yield from self._share(program, role, role.shares[0])

    def _share(self, program: Program, role: RoleInfo, share: ast.ShareGpus) -> Iterator[Diagnostic]:
        if share.resource.text != "gpus":
            hint = schema.did_you_mean(share.resource.text, ["gpus"]) or "only GPUs can be shared: `share gpus with ROLE`"
            yield Diagnostic("E127", f"cannot share `{share.resource.text}`", share.resource.span, hint)
        if "gpus" in role.config:
            gpus_setting = next(s for s in role.settings if s.key.text == "gpus")
            yield Diagnostic(
                "E161",
                f"role `{role.name}` declares `gpus {role.gpus}` and also shares the GPUs of `{share.target.text}`",
                gpus_setting.span,
                "a sharing role has no GPUs of its own; remove `gpus`, or remove the `share`",
                (Note(share.span, "shares here"),),
            )
        target = program.roles.get(share.target.text)
        if target is None:
            yield unknown_role(program, share.target)
            return
        if target.name == role.name:
            yield Diagnostic(
                "E160",
                f"role `{role.name}` shares GPUs with itself",
                share.target.span,
                "name the layer-0 role whose cards it runs on",
            )
        elif target.shares:
            yield Diagnostic(
                "E160",
                f"role `{target.name}` owns no GPUs: it shares those of `{target.share_target}`",
                share.target.span,
                f"share with the role that owns the cards: `share gpus with {target.share_target}`",
            )
        elif target.gpus <= 0:
            yield Diagnostic(
                "E160",
                f"role `{target.name}` owns no GPUs to share",
                share.target.span,
                f"give `{target.name}` `gpus N`, or give `{role.name}` GPUs of its own",
                (Note(target.decl.name.span, f"`{target.name}` declared here"),),
            )
