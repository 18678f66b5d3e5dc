"""Every state change of a work is written once: a guarded UPDATE named in workers.models.TRANSITIONS, made by
workers.lifecycle.transitions.move. Read from the code itself (its syntax tree), so a new `update(state=...)`
anywhere else, or a move of a name the table lacks, fails here."""
import ast
from pathlib import Path

from workers.models import TRANSITIONS, State

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [path for folder in ('api', 'workers', 'capacity', 'concepts', 'common', 'devstack')
           for path in (ROOT / folder).rglob('*.py') if 'migrations' not in path.parts]


def calls(path):
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Call):
            yield node


def name_of(node):
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, 'id', None)


def test_no_code_but_the_transitions_module_writes_a_state():
    writers = []
    for path in SOURCES:
        for node in calls(path):
            keywords = {keyword.arg for keyword in node.keywords}
            if name_of(node) in ('update', 'create', 'bulk_create', 'get_or_create') and 'state' in keywords:
                writers.append(f'{path.relative_to(ROOT)}:{node.lineno}')
    # `move` and `move_all` (many works at once, as a run's cancel makes them), and nothing else.
    assert writers == ['workers/lifecycle/transitions.py:19', 'workers/lifecycle/transitions.py:25']


def constants(node):
    """The string constants an expression can be: a constant, or either side of a conditional."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return constants(node.body) | constants(node.orelse)
    return set()


def test_every_move_names_a_transition_of_the_table_and_every_transition_is_made_somewhere():
    made = set()
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding='utf-8'))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and name_of(node) == 'move' and node.args:
                made |= constants(node.args[0])
            if isinstance(node, ast.Call):  # a transition handed on by name, e.g. fail(..., transition='time_out')
                made |= {value for keyword in node.keywords if keyword.arg == 'transition'
                         for value in constants(keyword.value)}
            if isinstance(node, ast.FunctionDef):
                arguments = node.args.args[-len(node.args.defaults):] if node.args.defaults else []
                made |= {value for argument, default in zip(arguments, node.args.defaults)
                         if argument.arg == 'transition' for value in constants(default)}
    assert made == set(TRANSITIONS)


def test_the_table_moves_only_between_states_and_from_open_ones():
    for name, transition in TRANSITIONS.items():
        assert set(transition.source) <= {State.QUEUED, State.RUNNING}, name  # a final state is final
        assert transition.target in State.values, name
