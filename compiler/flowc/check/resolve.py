"""Building the `Program` model from loaded modules: symbol tables, settings, the field index.

Resolution reports nothing; it keeps every declaration (duplicates too) and takes the first of
each name for the tables. The registered checks report the problems.
"""

from __future__ import annotations

from flowc.check import schema
from flowc.check.model import Consumer, FieldInfo, GraphInfo, InterfaceInfo, ModuleInfo, Producer, Program, RoleInfo
from flowc.syntax import ast

IMPORTABLE = (ast.Role, ast.Global, ast.Placeholder, ast.TypeAlias)


def build_program(modules: list[ModuleInfo]) -> Program:
    program = Program(modules=modules)
    for module in modules:
        for decl in module.ast.decls:
            if not module.is_root and not isinstance(decl, IMPORTABLE):
                continue
            _declare(program, decl, module)
    _index_fields(program)
    return program


def _declare(program: Program, decl: ast.Decl, module: ModuleInfo) -> None:
    match decl:
        case ast.Role():
            program.declarations.append(("role", decl.name, decl))
            program.roles.setdefault(decl.name.text, _role(decl, module.name))
        case ast.Placeholder():
            program.declarations.append(("placeholder", decl.name, decl))
            program.placeholders.setdefault(decl.name.text, decl)
        case ast.Global():
            program.declarations.append(("global", decl.name, decl))
            program.globals.setdefault(decl.name.text, decl)
        case ast.TypeAlias():
            program.declarations.append(("type", decl.name, decl))
            program.aliases.setdefault(decl.name.text, decl)
        case ast.Graph():
            program.declarations.append(("graph", decl.name, decl))
            program.graphs.setdefault(decl.name.text, _graph(decl))


def _role(decl: ast.Role, module: str) -> RoleInfo:
    settings = [i for i in decl.items if isinstance(i, ast.Setting)]
    interfaces: dict[str, InterfaceInfo] = {}
    for item in decl.items:
        if isinstance(item, ast.Interface):
            interfaces.setdefault(item.name.text, _interface(decl.name.text, item))
    return RoleInfo(
        name=decl.name.text,
        module=module,
        decl=decl,
        interfaces=interfaces,
        settings=settings,
        shares=[i for i in decl.items if isinstance(i, ast.ShareGpus)],
        config=schema.interpret(settings, schema.ROLE).values,
    )


def _interface(role: str, decl: ast.Interface) -> InterfaceInfo:
    settings = [i for i in decl.items if isinstance(i, ast.Setting)]
    return InterfaceInfo(
        role=role,
        name=decl.name.text,
        decl=decl,
        in_clauses=[i for i in decl.items if isinstance(i, ast.InClause)],
        out_clauses=[i for i in decl.items if isinstance(i, ast.OutClause)],
        join_clauses=[i for i in decl.items if isinstance(i, ast.JoinClause)],
        settings=settings,
        config=schema.interpret(settings, schema.INTERFACE).values,
    )


def _graph(decl: ast.Graph) -> GraphInfo:
    entry_clauses = [i for i in decl.items if isinstance(i, ast.EntryClause)]
    settings = [i for i in decl.items if isinstance(i, ast.Setting)]
    return GraphInfo(
        name=decl.name.text,
        decl=decl,
        entries=[name for clause in entry_clauses for name in clause.names],
        entry_clauses=entry_clauses,
        streams=[i for i in decl.items if isinstance(i, ast.StreamClause)],
        returns=[f for i in decl.items if isinstance(i, ast.ReturnClause) for f in i.fields],
        settings=settings,
        config=schema.interpret(settings, schema.GRAPH).values,
        interruptible=[i for i in decl.items if isinstance(i, ast.InterruptibleClause)],
    )


def _index_fields(program: Program) -> None:
    fields = program.fields

    def get(name: str) -> FieldInfo:
        info = fields.get(name)
        if info is None:
            info = fields[name] = FieldInfo(name)
        return info

    for interface in program.interfaces():
        stream = interface.stream
        for out in interface.outputs:
            get(out.name.text).producers.append(Producer(interface.role, interface.name, out, stream))
        for clause in interface.in_clauses:
            for group in clause.groups:
                for ref in group.inputs:
                    get(ref.field.text).consumers.append(Consumer(interface.role, interface.name, ref.field, ref.source, ref))
        for join in interface.join_clauses:
            for item in join.items:
                get(item.field.text).consumers.append(Consumer(interface.role, interface.name, item.field, item.source, item))
