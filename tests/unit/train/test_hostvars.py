"""train/hostvars.py: one typed definition of every host variable tandem reads, and nothing read around it.

The scans below fail when code reads a variable the definition lacks: the Python sources (ast: the
Host.var / hostvars reads, and any `.vars.get("x")` / `.vars["x"]` that goes around the definition),
the roles' filter plugins (their `hostvars[host].get("x")`), and the roles and playbooks (Jinja: a
variable no role or playbook defines, and not Ansible's own, comes from the inventory). They also
fail on a definition nobody reads, and on an inventory that sets a variable nobody reads (a typo).
"""

from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path

import pytest
import yaml
from jinja2 import Environment, nodes

from train import hostvars
from train.cluster import ClusterError, Host

TOP = Path(__file__).resolve().parents[3]
PYTHON_SOURCES = [TOP / "fabfile.py", *(p for d in ("train", "benchmarks", "lab")
                                        for p in sorted((TOP / d).rglob("*.py")) if "__pycache__" not in p.parts)]
ROLE_PLUGINS = sorted((TOP / "roles").glob("*/filter_plugins/*.py")) + sorted((TOP / "roles").glob("*/library/*.py"))
ANSIBLE_YAML = sorted((TOP / "roles").glob("*/tasks/*.yml")) + sorted((TOP / "roles").glob("*/handlers/*.yml")) \
    + sorted((TOP / "roles").glob("*/defaults/*.yml")) + sorted((TOP / "roles").glob("*/vars/*.yml")) \
    + sorted((TOP / "playbooks").glob("*.yml")) + [TOP / "provision.yml"]
TEMPLATES = sorted((TOP / "roles").glob("*/templates/*.j2"))
# Ansible's and Jinja's own names, never the inventory's
ANSIBLE_OWN = {"hostvars", "groups", "group_names", "inventory_hostname", "inventory_hostname_short", "inventory_dir",
               "inventory_file", "playbook_dir", "role_path", "role_name", "item", "omit", "lookup", "query", "q",
               "now", "dict", "range", "loop", "lipsum", "zip", "true", "false", "none", "True", "False", "None",
               "play_hosts", "environment", "undef"}
EXPRESSION_KEYS = {"when", "that", "failed_when", "changed_when", "until"}  # bare Jinja expressions
HOSTVARS_API = {"get": 1, "given": 1, "defined": 0, "value": 1}  # hostvars.<function>: the name's argument


def host(**variables) -> Host:
    return Host("v100b", "10.0.0.2", vars=variables)


# ---- the definition, read --------------------------------------------------------------------


def test_a_value_comes_back_typed_and_an_unset_one_as_its_default():
    h = host(gpus="2", hourly_usd="3.06", tandem_lab="yes", network_iperf_streams="4", cpu_ranks=None)
    assert h.var("gpus") == 2 and h.var("hourly_usd") == 3.06 and h.var("tandem_lab") is True
    assert h.var("network_iperf_streams") == 4 and host().var("network_iperf_streams") == "auto"
    assert h.var("cpu_ranks") == 1 and host().var("network_min_ratio") == 0.9 and host().var("train_threads") is None
    assert host().var("tandem_venv") == "/opt/tandem/venv" and host(train_threads="").var("train_threads") is None


@pytest.mark.parametrize(("name", "value", "must"), [
    ("gpus", "two", "a whole number of GPUs (0 or more)"),
    ("gpus", 1.5, "a whole number of GPUs (0 or more)"),
    ("network_min_ratio", 1.5, "a share (a number, above 0, at most 1)"),
    ("network_expected_mbps", 0, "a whole number of Mb/s (1 or more)"),
    ("hourly_usd", -1, "US dollars per hour (a number, 0 or more)"),
    ("tandem_lab", "maybe", "true or false"),
    ("network_iperf_streams", "many", "auto or a whole number (1 or more)"),
])
def test_a_value_of_the_wrong_type_names_the_host_the_variable_and_what_it_must_be(name, value, must):
    with pytest.raises(ClusterError) as err:
        host(**{name: value}).var(name)
    assert str(err.value) == f"v100b: {name} must be {must}, the inventory gives {value!r}"


def test_reading_a_name_the_definition_lacks_raises_even_when_the_inventory_sets_it():
    with pytest.raises(KeyError, match="'hourly_price' is not one of tandem's host variables: define it in "
                                       "train/hostvars.py"):
        host(hourly_price=3).var("hourly_price")


def test_the_docs_table_is_the_definition():
    doc = hostvars.DOC.read_text()
    assert hostvars.with_table(doc) == doc, "docs/inventory.md: run `.venv/bin/python -m train.hostvars --update-doc`"
    for var in hostvars.VARIABLES:
        assert f"| `{var.name}` |" in doc


# ---- what the code reads ---------------------------------------------------------------------


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level NAME = "text" (price.PRICE_VAR)."""
    return {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            and isinstance(n.value.value, str) for t in n.targets if isinstance(t, ast.Name)}


def _text(node: ast.AST, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return constants.get(node.id) if isinstance(node, ast.Name) else None


def python_reads(path: Path) -> tuple[set[str], list[str]]:
    """(names read through the definition, `file:line name` of reads around it)."""
    tree = ast.parse(path.read_text())
    constants, through, around = _constants(tree), set(), []
    shown = path.relative_to(TOP) if path.is_relative_to(TOP) else path
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "var" and node.args:
            through.add(_text(node.args[0], constants) or f"<not a literal at {path.name}:{node.lineno}>")  # a helper
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f, args = node.func, node.args
            if f.attr == "var" and len(args) == 1:  # host.var("name")
                through.add(_text(args[0], constants) or f"<not a literal at {path.name}:{node.lineno}>")
            elif isinstance(f.value, ast.Name) and f.value.id == "hostvars" and f.attr in HOSTVARS_API:
                at = HOSTVARS_API[f.attr]
                if len(args) > at and (name := _text(args[at], constants)):
                    through.add(name)
            elif f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr == "vars" and args:
                around.append(f"{shown}:{node.lineno} {_text(args[0], constants)}")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "vars":
            around.append(f"{shown}:{node.lineno} {_text(node.slice, constants)}")
    return through, around


def plugin_reads(path: Path) -> set[str]:
    """A role plugin's literal reads of one host's variables: `hostvars[h].get("x")`, `v = hostvars[h]; v["x"]`."""
    tree = ast.parse(path.read_text())

    def of_hostvars(node: ast.AST) -> bool:
        return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "hostvars"

    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and of_hostvars(n.value)
               for t in n.targets if isinstance(t, ast.Name)}

    def is_host(node: ast.AST) -> bool:
        return of_hostvars(node) or (isinstance(node, ast.Name) and node.id in aliases)

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and is_host(node.func.value) and node.args:
            found.add(_text(node.args[0], {}))
        elif isinstance(node, ast.Subscript) and is_host(node.value):
            found.add(_text(node.slice, {}))
    return found - {None}  # a name that is no literal: the filter's caller names it


def test_python_reads_every_host_variable_through_the_definition():
    through, around = set(), []
    for path in PYTHON_SOURCES:
        if path == TOP / "train" / "hostvars.py":
            continue
        names, raw = python_reads(path)
        through |= names
        around += raw
    assert not around, f"host variables read around train/hostvars.py (use host.var): {around}"
    assert through - set(hostvars.DEFINITION) == set(), "read but not defined in train/hostvars.py"


def _jinja_names(text: str, expression: bool) -> tuple[set[str], set[str]]:
    """(variables a template or expression reads, names it reads from another host: hostvars[h].x)."""
    try:
        with warnings.catch_warnings():  # a regex's \s in a YAML string
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = Environment().parse("{{ " + text + " }}" if expression else text)
    except Exception:  # noqa: BLE001 - Ansible's own syntax Jinja does not know: no names read
        return set(), set()
    stored = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    loads = {n.name for n in tree.find_all(nodes.Name) if n.ctx == "load"} - stored
    others = set()
    for n in tree.find_all((nodes.Getattr, nodes.Getitem)):
        if of_hostvars_item(n.node):
            if isinstance(n, nodes.Getattr):
                others.add(n.attr)
            elif isinstance(n.arg, nodes.Const):
                others.add(n.arg.value)
    for f in tree.find_all(nodes.Filter):  # map('extract', hostvars, 'x')
        a = f.args
        if f.name == "map" and len(a) >= 3 and isinstance(a[0], nodes.Const) and a[0].value == "extract" \
                and isinstance(a[1], nodes.Name) and a[1].name == "hostvars" and isinstance(a[2], nodes.Const):
            others.add(a[2].value)
    return loads, others


def of_hostvars_item(node) -> bool:
    return isinstance(node, (nodes.Getitem, nodes.Getattr)) and isinstance(node.node, nodes.Name) \
        and node.node.name == "hostvars"


def _strings(node, key=None):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
    elif isinstance(node, str):
        yield key, node


def role_defined() -> set[str]:
    """What the roles and playbooks define themselves: defaults, vars, facts, registered results, loop vars."""
    found: set[str] = set()
    for path in sorted((TOP / "roles").glob("*/defaults/*.yml")) + sorted((TOP / "roles").glob("*/vars/*.yml")):
        found |= set(yaml.safe_load(path.read_text()) or {})

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "register" and isinstance(v, str):
                    found.add(v)
                elif k in ("set_fact", "ansible.builtin.set_fact", "vars") and isinstance(v, dict):
                    found.update(v)
                elif k == "loop_control" and isinstance(v, dict) and "loop_var" in v:
                    found.add(v["loop_var"])
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for path in ANSIBLE_YAML:
        walk(yaml.safe_load(path.read_text()))
    return found


def ansible_reads() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({variable: files}, {variable read from another host: files}) over the roles, playbooks, templates."""
    reads: dict[str, set[str]] = {}
    others: dict[str, set[str]] = {}

    def add(text: str, expression: bool, where: str) -> None:
        names, other = _jinja_names(text, expression)
        for n in names:
            reads.setdefault(n, set()).add(where)
        for n in other:
            others.setdefault(n, set()).add(where)

    for path in ANSIBLE_YAML:
        for key, text in _strings(yaml.safe_load(path.read_text())):
            add(text, key in EXPRESSION_KEYS and "{{" not in text, str(path.relative_to(TOP)))
    for path in TEMPLATES:
        add(path.read_text(), False, str(path.relative_to(TOP)))
    for path in ROLE_PLUGINS:
        for n in plugin_reads(path):
            others.setdefault(n, set()).add(str(path.relative_to(TOP)))
    return reads, others


def test_the_scans_see_a_read_around_the_definition_and_a_name_it_lacks(tmp_path):
    """The scans themselves: a raw read, a typo'd name, a role default reading the inventory."""
    reader = tmp_path / "reader.py"
    reader.write_text('PRICE = "hourly_price"\n\ndef f(h):\n    return h.vars.get("hourly_usd"), h.vars["gpus"], '
                      'h.var(PRICE)\n')
    through, around = python_reads(reader)
    assert through == {"hourly_price"} and [a.split()[-1] for a in around] == ["hourly_usd", "gpus"]
    assert through - set(hostvars.DEFINITION) == {"hourly_price"}
    assert _jinja_names("{{ data_volume_size | default(brand_new) }}", False)[0] == {"data_volume_size", "brand_new"}
    assert _jinja_names("hostvars[h].cluster_addres is defined", True)[1] == {"cluster_addres"}
    plugin = tmp_path / "plugin.py"
    plugin.write_text("def f(hosts, hostvars):\n    v = hostvars[hosts[0]]\n    return v.get('cluster_adress'), "
                      "hostvars[hosts[1]]['gpu']\n")
    assert plugin_reads(plugin) == {"cluster_adress", "gpu"}


def test_the_roles_read_no_inventory_variable_the_definition_lacks():
    reads, others = ansible_reads()
    defined = role_defined()
    from_inventory = {n: w for n, w in reads.items()
                      if n not in defined and n not in ANSIBLE_OWN and not n.startswith("ansible_")}
    missing = {n: sorted(w) for n, w in from_inventory.items() if n not in hostvars.DEFINITION}
    assert not missing, f"the roles read these from the inventory; define them in train/hostvars.py: {missing}"
    unknown = {n: sorted(w) for n, w in others.items()
               if n not in defined and n not in hostvars.DEFINITION and not n.startswith("ansible_")}
    assert not unknown, f"read from another host's variables, defined nowhere: {unknown}"


def test_every_defined_variable_is_read_by_a_reader_it_names():
    python = set()
    for path in PYTHON_SOURCES:
        python |= python_reads(path)[0]
    reads, others = ansible_reads()
    for var in hostvars.VARIABLES:
        for reader in var.readers:
            if reader.startswith("fab"):
                assert var.name in python, f"{var.name}: the definition says fab reads it; no Python does"
            elif reader.startswith("roles/"):
                role = reader.split("/")[1]
                text = "".join(p.read_text() for p in (TOP / "roles" / role).rglob("*") if p.is_file())
                assert var.name in text, f"{var.name}: the definition says {reader} reads it; it does not"


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_preflights_number_rules_name_known_variables():
    rules = _module(TOP / "roles" / "preflight" / "filter_plugins" / "preflight_numbers.py").RULES
    defined = role_defined()
    assert {n for n in rules if n not in defined and n not in hostvars.DEFINITION} == set()
    for name in set(rules) & set(hostvars.DEFINITION):  # one idea of a valid value, not two
        assert not rules[name].problem(hostvars.DEFINITION[name].default or 1), name


# ---- what the inventories set ----------------------------------------------------------------


def _inventory_variables(node) -> set[str]:
    """Every variable a YAML inventory sets (vars: and host entries, at any depth of children)."""
    found: set[str] = set()
    for group in (node or {}).values():
        group = group or {}
        found |= set(group.get("vars") or {})
        for entry in (group.get("hosts") or {}).values():
            found |= set(entry or {})
        found |= _inventory_variables(group.get("children"))
    return found


def inventories() -> dict[str, set[str]]:
    from lab import inventory as lab_inventory
    from lab.config import LabConfig
    from train.onboard.init import render
    from train.onboard.spec import InventorySpec, NewHost

    cfg = LabConfig(ranks=2, slow_nic_hosts=("v100b",))
    written = {
        "inventory/hosts.yml": yaml.safe_load((TOP / "inventory" / "hosts.yml").read_text()),
        "lab/inventory.py": yaml.safe_load(lab_inventory.render(cfg, {n: "/dev/loop0" for n in cfg.names})),
        "fab init": yaml.safe_load(render(InventorySpec((NewHost("gpu1", "203.0.113.10", "10.0.0.10", 1),), "ubuntu",
                                                        "~/.ssh/id_ed25519", "~/.ssh/known", hourly_usd=2.5))),
    }
    found = {name: _inventory_variables(data) for name, data in written.items()}
    for path in sorted((TOP / "inventory" / "examples").glob("*.yml")):
        found[str(path.relative_to(TOP))] = set(yaml.safe_load(path.read_text()).get("compose") or {})
    return found


def test_every_variable_an_inventory_sets_is_read_by_tandem_or_ansible():
    """A name nobody reads is a typo (`hourly_price:`) that leaves the real one unset."""
    role_parameters = role_defined()
    for where, names in inventories().items():
        unread = {n for n in names if n not in hostvars.DEFINITION and n not in role_parameters
                  and not n.startswith("ansible_")}
        assert not unread, f"{where} sets {sorted(unread)}, which tandem does not read"
