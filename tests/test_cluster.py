"""``cluster/``: the launcher YAMLs pass Ray's own validation, the KubeRay manifests carry what a
RayJob needs, and a real multi-process cluster on this machine (``ray start --head`` plus a second
``ray start`` node with logical GPUs, token authentication on) runs ``raysim run`` and
``raysim tune`` submitted as Ray jobs, landing complete in an MLflow server on the head.

What locks a cluster down is checked offline: the NetworkPolicy admits the KubeRay operator from
its own namespace only; the node scripts pass Ray's TLS settings through when set (their
``--dry-run``) and pin every port that ``firewall.sh``'s rules open; the README's openssl commands
make certificates the scripts take; the cloud templates' comments say what their rules allow."""

from __future__ import annotations

import ast
import copy
import http.client
import importlib.util
import ipaddress
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from raysim.config import ConfigError, load_config
from raysim.launch.placement import (
    check_state_outlives_job,
    check_store_node,
    check_store_outlives_job,
)
from raysim.tracking.store import node_local, store_path
from tests.conftest import ROOT, tiny

CLUSTER = ROOT / "cluster"
LAUNCHERS = sorted(CLUSTER.glob("*.yaml"))
RAY_PIN = re.search(r"^ray\[[^\]]*\]==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)[1]


def launcher_yamls() -> list[Path]:
    return [p for p in LAUNCHERS if "provider" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", launcher_yamls(), ids=lambda p: p.name)
def test_launcher_yamls_pass_rays_own_validation(path):
    """The check Ray's test suite applies to its example YAMLs (test_autoscaler_yaml.py)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(path.read_text())
    validate_config(prepare_config(copy.deepcopy(raw)))
    # ... and the check can fail: a misspelt key is refused
    broken = copy.deepcopy(raw)
    broken["head_start_ray_comands"] = broken.pop("head_start_ray_commands")
    with pytest.raises(Exception, match="head_start_ray_comands"):
        validate_config(prepare_config(broken))
    # private by default: token auth on every node, dashboard on the head's loopback, the
    # token shipped to every node, nothing but SSH opened
    text = path.read_text()
    assert "start-head.sh" in text and "start-worker.sh" in text
    assert raw["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for cmd in raw["setup_commands"]:
        assert "requirements.txt" in cmd or ".venv" in cmd  # the pinned versions
    if raw["provider"]["type"] == "aws":
        ports = raw["provider"]["security_group"]["IpPermissions"]
        assert [(p["FromPort"], p["ToPort"]) for p in ports] == [(22, 22)]
    if "docker" in raw:
        assert raw["docker"]["image"].startswith(f"rayproject/ray:{RAY_PIN}-py311")


def test_node_start_scripts_keep_the_cluster_private(tmp_path):
    head = (CLUSTER / "start-head.sh").read_text()
    worker = (CLUSTER / "start-worker.sh").read_text()
    common = (CLUSTER / "common.sh").read_text()
    for script in (head, worker):
        assert "export RAY_AUTH_MODE=token" in script
    assert "--dashboard-host=127.0.0.1" in head
    assert "mlflow server --host 127.0.0.1" in head
    assert "0.0.0.0" not in head + worker + common
    # what they would start, as Ray's own `ray start` parses it: token auth even where the
    # caller's environment turned it off (the Makefile does), the dashboard on loopback
    env = {"RAY_AUTH_MODE": "disabled"}
    settings, commands = node_dry_run("start-head.sh", tmp_path, env, "--autoscaling-config=x")
    assert settings == {"RAY_AUTH_MODE": "token"}
    head_start = ray_start_params(commands[0])
    assert head_start["dashboard_host"] == "127.0.0.1" and head_start["head"]
    assert head_start["autoscaling_config"] == "x"  # extra arguments go to `ray start`
    assert commands[1][:5] == ["mlflow", "server", "--host", "127.0.0.1", "--port"]
    settings, commands = node_dry_run("start-worker.sh", tmp_path, env)
    assert settings == {"RAY_AUTH_MODE": "token"}
    assert ray_start_params(commands[0])["address"] == "10.0.0.10:6379"


# --------------------------------------------------------------------------- locked down
def node_dry_run(
    script: str, home: Path, env: dict[str, str] | None = None, *args: str, rc: int = 0
) -> tuple[dict[str, str], list[list[str]]]:
    """``cluster/SCRIPT --dry-run``: the Ray settings it would start with, and its commands."""
    proc = subprocess.run(
        ["bash", str(CLUSTER / script), "--dry-run", *args],
        env={"PATH": os.environ["PATH"], "HOME": str(home), "RAY_HEAD_IP": "10.0.0.10",
             **(env or {})},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == rc, proc.stderr
    if rc:
        assert not proc.stdout, "nothing is started after a refusal"
        return {"stderr": proc.stderr}, []
    lines = proc.stdout.splitlines()
    settings = dict(ln.split("=", 1) for ln in lines if re.match(r"^RAY_[A-Z_]+=", ln))
    commands = [shlex.split(ln) for ln in lines if not re.match(r"^RAY_[A-Z_]+=", ln)]
    return settings, commands


def ray_start_params(argv: list[str]) -> dict:
    """``ray start ...`` as Ray's own command parses it (a misspelt flag fails here)."""
    from ray.scripts.scripts import start

    assert argv[:2] == ["ray", "start"], argv
    return start.make_context("start", argv[2:]).params


def ray_ports(params: dict) -> set[int]:
    """The ports a parsed ``ray start`` pins for Ray's own traffic: the GCS's, each process's,
    the workers' range; not the dashboard's (on loopback: reached through the tunnel)."""
    single = {"port"} | {k for k in params if k.endswith("_port")}
    single -= {"min_worker_port", "max_worker_port", "dashboard_port"}
    ports = {params[k] for k in single} - {None}
    return ports | set(range(params["min_worker_port"], params["max_worker_port"] + 1))


def test_start_scripts_pass_tls_settings_through_when_set(tmp_path):
    tls = tmp_path / ".ray" / "tls"
    for script in ("start-head.sh", "start-worker.sh"):
        # unset: no TLS, and nothing asked for
        settings, commands = node_dry_run(script, tmp_path)
        assert not any(k.startswith(("RAY_USE_TLS", "RAY_TLS")) for k in settings)
        assert commands[0][:2] == ["ray", "start"]
        # on, files missing: refused before Ray starts, naming the file and where to read
        said, _ = node_dry_run(script, tmp_path, {"RAY_USE_TLS": "1"}, rc=2)
        assert f"{tls}/node.crt is not a readable file" in said["stderr"]
        assert "cluster/README.md" in said["stderr"]
        said, _ = node_dry_run(script, tmp_path, {"RAY_USE_TLS": "yes"}, rc=2)
        assert "RAY_USE_TLS must be 1" in said["stderr"]
        # on, with the default files: passed to Ray
        tls.mkdir(parents=True, exist_ok=True)
        for name in ("node.crt", "node.key", "ca.crt"):
            (tls / name).write_text("x")
        settings, _ = node_dry_run(script, tmp_path, {"RAY_USE_TLS": "1"})
        assert settings == {
            "RAY_AUTH_MODE": "token",
            "RAY_USE_TLS": "1",
            "RAY_TLS_SERVER_CERT": f"{tls}/node.crt",
            "RAY_TLS_SERVER_KEY": f"{tls}/node.key",
            "RAY_TLS_CA_CERT": f"{tls}/ca.crt",
        }
        # on, with paths of the caller's: those, untouched
        mine = {"RAY_USE_TLS": "true", "RAY_TLS_SERVER_CERT": str(tmp_path / "a.pem"),
                "RAY_TLS_SERVER_KEY": str(tmp_path / "b.pem"),
                "RAY_TLS_CA_CERT": str(tmp_path / "c.pem")}  # fmt: skip
        for name in ("a.pem", "b.pem", "c.pem"):
            (tmp_path / name).write_text("x")
        settings, _ = node_dry_run(script, tmp_path, mine)
        assert settings == {"RAY_AUTH_MODE": "token", **mine, "RAY_USE_TLS": "1"}
        # off, said so: off
        settings, _ = node_dry_run(script, tmp_path, {"RAY_USE_TLS": "0"})
        assert "RAY_USE_TLS" not in settings
        shutil.rmtree(tls)


def firewall(*args: str, rc: int = 0) -> str:
    proc = subprocess.run(
        ["bash", str(CLUSTER / "firewall.sh"), *args], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == rc, proc.stderr
    return proc.stdout + proc.stderr


def _nft_ports(spec: str) -> set[int]:
    ports: set[int] = set()
    for item in spec.strip("{} ").split(","):
        lo, _, hi = item.strip().partition("-")
        ports |= set(range(int(lo), int(hi or lo) + 1))
    return ports


#: the ``ray start`` flags that Ray, unset, leaves to a random port (or a random worker's port)
PINNED = (
    "object_manager_port",
    "node_manager_port",
    "dashboard_agent_grpc_port",
    "runtime_env_agent_port",
    "metrics_export_port",
    "dashboard_agent_listen_port",
    "min_worker_port",
    "max_worker_port",
)


def test_the_firewall_opens_rays_pinned_ports_to_the_cluster_and_nothing_else(tmp_path):
    _, head = node_dry_run("start-head.sh", tmp_path)
    _, worker = node_dry_run("start-worker.sh", tmp_path)
    head_start, worker_start = ray_start_params(head[0]), ray_start_params(worker[0])
    dashboard = head_start["dashboard_port"]
    ray = ray_ports(head_start) | ray_ports(worker_start)
    # every port pinned, none left to chance: Ray picks a random one where a flag is unset
    for params in (head_start, worker_start):
        for flag in PINNED:
            assert params[flag], flag
    assert head_start["ray_client_server_port"] and dashboard == 8265

    hosts, you = "10.0.0.10,10.0.0.11,fd00::12", "203.0.113.7"
    rules = firewall("--hosts", hosts, "--operator", you)
    assert "policy drop;" in rules
    assert "elements = { 10.0.0.10,10.0.0.11 }" in rules
    assert "elements = { fd00::12 }" in rules and "elements = { 203.0.113.7 }" in rules
    opened = {}
    for source, spec in re.findall(r"ip6? saddr @(\w+) tcp dport (\{[^}]*\}|\d+) accept", rules):
        opened.setdefault(source, set()).update(_nft_ports(spec))
    # Ray's ports from the cluster's hosts, exactly; SSH from them and you; the dashboard: you
    assert opened["cluster4"] == opened["cluster6"] == ray | {22}
    assert opened["operator4"] == {22, dashboard}
    assert dashboard not in ray
    if shutil.which("nft"):  # nftables' own parser, where this machine has it
        (tmp_path / "raysim.nft").write_text(rules)
        check = subprocess.run(["nft", "-c", "-f", str(tmp_path / "raysim.nft")],
                               capture_output=True, text=True)  # fmt: skip
        if "Operation not permitted" not in check.stderr:
            assert check.returncode == 0, check.stderr

    ufw = firewall("--ufw", "--hosts", hosts, "--operator", you)
    assert "ufw default deny incoming" in ufw
    for host in hosts.split(","):
        (spec,) = re.findall(rf"from {re.escape(host)} to any port (\S+) comment 'raysim: R", ufw)
        assert _nft_ports(spec.replace(":", "-")) == ray
    (spec,) = re.findall(rf"from {re.escape(you)} to any port (\S+)", ufw)
    assert _nft_ports(spec) == {22, dashboard}

    # addresses only: a name, an empty entry or a shell word is refused, nothing printed
    for bad in ("10.0.0.1;reboot", "10.0.0.1,,10.0.0.2", "head.example", "123"):
        said = firewall("--hosts", bad, "--operator", you, rc=2)
        assert "not an IP address" in said and "table" not in said
    assert "usage" in firewall("--hosts", hosts, rc=2)


def _operator_peers(policy: dict) -> list[dict]:
    """The ``from`` entries of a NetworkPolicy that select the KubeRay operator's pod."""
    return [
        peer
        for rule in policy["spec"].get("ingress", [])
        for peer in rule.get("from", [])
        if "kuberay-operator" in json.dumps(peer.get("podSelector", {}))
    ]


def operator_scoped_to_one_namespace(policy: dict) -> bool:
    """Each entry that admits the operator's pod also names exactly one namespace, by name."""
    peers = _operator_peers(policy)
    for peer in peers:
        selector = peer.get("namespaceSelector")
        if not selector or set(selector) != {"matchLabels"}:
            return False
        labels = selector["matchLabels"]
        if set(labels) != {"kubernetes.io/metadata.name"}:
            return False
        name = str(labels["kubernetes.io/metadata.name"])
        if not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9]*", name):  # one name, no pattern
            return False
    return bool(peers)


def test_kuberay_network_policy_admits_the_operator_from_its_namespace_only():
    text = (CLUSTER / "kuberay/raycluster.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies
    for policy in policies:
        assert operator_scoped_to_one_namespace(policy)
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert peer.get("namespaceSelector", None) != {}, "every namespace"
                assert "ipBlock" not in peer
                if peer in _operator_peers(policy):  # the operator: the job server's port only
                    assert rule["ports"] == [{"protocol": "TCP", "port": 8265}]
                else:  # this namespace's pods of this cluster only
                    assert set(peer) == {"podSelector"}
                    assert peer["podSelector"]["matchLabels"] == {"ray.io/cluster": "raysim"}
    # the namespace is a placeholder the file and the README explain
    (peer,) = _operator_peers(policies[0])
    placeholder = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    assert placeholder == "YOUR-OPERATOR-NAMESPACE"
    assert text.count(placeholder) >= 2 and placeholder in (CLUSTER / "README.md").read_text()
    head = next(d for d in docs if d["kind"] == "RayCluster")["spec"]["headGroupSpec"]
    ports = head["template"]["spec"]["containers"][0]["ports"]
    assert {"containerPort": 8265, "name": "dashboard"} in ports

    # ... and the check fails on what it replaced: the operator's label from any namespace, or
    # from this one only through a podSelector standing alone
    def policy(*peers):
        return {"spec": {"ingress": [{"from": list(peers)}]}}

    operator = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}
    assert not operator_scoped_to_one_namespace(policy({"namespaceSelector": {}, **operator}))
    assert not operator_scoped_to_one_namespace(policy(operator))
    assert not operator_scoped_to_one_namespace(policy(
        {"namespaceSelector": {"matchLabels": {"team": "ml"}}, **operator}
    ))  # fmt: skip
    assert not operator_scoped_to_one_namespace(policy(
        {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                     "operator": "Exists"}]}, **operator}
    ))  # fmt: skip


def readme_section(title: str) -> str:
    text = (CLUSTER / "README.md").read_text()
    level = re.search(rf"^(#+) {re.escape(title)}$", text, re.M)
    assert level, f"cluster/README.md has no section {title!r}"
    rest = text[level.end() :]
    end = re.search(rf"^#{{1,{len(level[1])}}} ", rest, re.M)
    return rest[: end.start() if end else len(rest)]


def test_readme_says_how_to_lock_a_cluster_down(tmp_path):
    lock = readme_section("Lock it down")
    for part in ("Ports Ray uses", "Firewall on your own machines", "TLS across hosts",
                 "NetworkPolicy on Kubernetes", "SSH on AWS and GCP"):  # fmt: skip
        assert f"### {part}" in lock
    # the ports table lists every port the scripts pin, with the scripts' values
    _, head = node_dry_run("start-head.sh", tmp_path)
    _, worker = node_dry_run("start-worker.sh", tmp_path)
    table = readme_section("Ports Ray uses")
    listed: set[int] = set()
    for first in re.findall(r"^\| (\d+(?:–\d+)?) \|", table, re.M):
        lo, _, hi = first.partition("–")
        listed |= set(range(int(lo), int(hi or lo) + 1))
    assert ray_ports(ray_start_params(head[0])) | ray_ports(ray_start_params(worker[0])) <= listed
    assert "cluster/firewall.sh" in readme_section("Firewall on your own machines")
    # TLS: Ray's four settings, where the scripts take them, and that the token is in clear
    tls = readme_section("TLS across hosts")
    for variable in ("RAY_USE_TLS", "RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT"):
        assert f"`{variable}`" in tls
    assert "~/.ray/tls/node.crt" in tls and "start-head.sh" in tls and "openssl" in tls
    assert "in clear" in lock
    # NetworkPolicy: enforced only by some plugins, and how to tell
    policy = readme_section("NetworkPolicy on Kubernetes")
    assert "enforced only if the cluster's network plugin enforces it" in policy
    for plugin in ("Calico", "Cilium", "Flannel"):
        assert plugin in policy
    assert "kubectl run np-probe" in policy and "raysim-head-svc:8265" in policy


def test_readme_openssl_commands_make_certificates_the_scripts_take(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("no openssl on this machine")
    blocks = re.findall(r"```bash\n(.*?)```", readme_section("TLS across hosts"), re.S)
    (block,) = [b for b in blocks if "openssl req -x509" in b]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    made = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip().endswith("node.crt: OK")
    certs = tmp_path / "raysim-tls"
    assert (certs / "ca.key").stat().st_mode & 0o077 == 0
    assert (certs / "node.key").stat().st_mode & 0o077 == 0

    def names(cert: Path) -> set[str]:
        argv = ["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        found = re.findall(r"IP Address:([0-9A-Fa-f:.]+)", out.stdout)
        return {str(ipaddress.ip_address(a)) for a in found}

    # the README's certificate names every host of the on-prem example, and loopback
    onprem = yaml.safe_load((CLUSTER / "onprem.yaml").read_text())["provider"]
    assert names(certs / "node.crt") == {onprem["head_ip"], *onprem["worker_ips"], "127.0.0.1"}
    # make-node-cert.sh makes one the same way, from the same CA
    other = tmp_path / "other"
    other.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy(certs / name, other / name)
    script = str(CLUSTER / "make-node-cert.sh")
    subprocess.run(["bash", script, str(other), "10.1.2.3", "fd00::7"], env=env, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    subprocess.run(["openssl", "verify", "-CAfile", str(certs / "ca.crt"), str(other / "node.crt")],
                   check=True, capture_output=True)  # fmt: skip
    assert names(other / "node.crt") == {"10.1.2.3", "fd00::7", "127.0.0.1"}
    bad = subprocess.run(["bash", script, str(other), "10.1.2.3;id"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "not an IP address" in bad.stderr
    # shipped where the scripts look (file_mounts in the README), they start Ray with them
    shipped = tmp_path / ".ray" / "tls"
    shipped.mkdir(parents=True)
    for name in ("ca.crt", "node.crt", "node.key"):
        shutil.copy(certs / name, shipped / name)
    settings, _ = node_dry_run("start-worker.sh", tmp_path, {"RAY_USE_TLS": "1"})
    assert settings["RAY_TLS_SERVER_KEY"] == str(shipped / "node.key")
    assert "~/.ray/tls/node.key: ~/raysim-tls/node.key" in readme_section("TLS across hosts")


# what GCP's default network lets in (its pre-populated rules; Ray adds none on GCP):
# https://cloud.google.com/vpc/docs/firewalls#more_rules_default_vpc
GCP_DEFAULT_RULES = {
    "default-allow-ssh": ("tcp:22", "0.0.0.0/0"),
    "default-allow-rdp": ("tcp:3389", "0.0.0.0/0"),
    "default-allow-icmp": ("icmp", "0.0.0.0/0"),
    "default-allow-internal": ("tcp:0-65535, udp:0-65535 and icmp", "10.128.0.0/9"),
}


def _comments(path: Path) -> str:
    """A YAML file's comment lines, indented or not."""
    lines = path.read_text().splitlines(keepends=True)
    return "".join(ln.lstrip() for ln in lines if ln.lstrip().startswith("#"))


def ray_functions(module: str, *names: str) -> dict:
    """Functions of one of Ray's cloud-provider modules, from its source: the module itself
    imports the cloud's SDK (boto3, googleapiclient), which this environment need not have."""
    path = Path(importlib.util.find_spec("ray").origin).parent / f"{module.replace('.', '/')}.py"
    tree = ast.parse(path.read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert sorted(d.name for d in defs) == sorted(names), path
    namespace = {"copy": copy, "itertools": itertools}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def test_cloud_templates_say_what_their_rules_let_in():
    aws_config = ray_functions(
        "autoscaler._private.aws.config",
        "_create_default_inbound_rules",
        "_create_default_intracluster_inbound_rules",
        "_create_default_ssh_inbound_rules",
    )
    gcp_config = ray_functions(
        "autoscaler._private.gcp.config", "_configure_subnet", "_list_subnets"
    )

    # GCP: the header names each default rule, its ports and its sources
    gcp = _comments(CLUSTER / "gcp.yaml")
    for rule, (ports, source) in GCP_DEFAULT_RULES.items():
        (line,) = [ln for ln in gcp.splitlines() if rule in ln]
        assert ports in line and source in line, line
    assert "VMs only" not in gcp  # what it said: SSH and the cluster's own VMs only

    # ... and that Ray gives each node an external address, which the rules above then face
    class Subnets:
        def subnetworks(self):
            return self

        def list(self, **_):
            return self

        def execute(self):
            return {"items": [{"selfLink": "projects/p/regions/r/subnetworks/default"}]}

    raw = yaml.safe_load((CLUSTER / "gcp.yaml").read_text())
    nodes = gcp_config["_configure_subnet"](raw, Subnets())["available_node_types"]
    for node in nodes.values():
        (interface,) = node["node_config"]["networkInterfaces"]
        assert interface["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
        assert node["node_config"]["tags"] == {"items": ["raysim"]}  # what the README targets
    assert "external" in gcp and "--target-tags=raysim" in readme_section("SSH on AWS and GCP")

    # AWS: Ray adds SSH from anywhere beside the config's own rule; the comment says so
    raw = yaml.safe_load((CLUSTER / "aws.yaml").read_text())
    mine = raw["provider"]["security_group"]["IpPermissions"]
    added = aws_config["_create_default_inbound_rules"]({"sg-1"}, mine)
    anywhere = [r for r in added if {"CidrIp": "0.0.0.0/0"} in r.get("IpRanges", [])]
    assert [(r["FromPort"], r["ToPort"]) for r in anywhere] == [(22, 22)]
    aws = _comments(CLUSTER / "aws.yaml")
    assert "0.0.0.0/0" in aws and "from your address only" not in aws
    assert "revoke-security-group-ingress" in readme_section("SSH on AWS and GCP")


def test_kuberay_manifests_carry_what_a_rayjob_needs():
    docs = {
        d["kind"]: d for d in yaml.safe_load_all((CLUSTER / "kuberay/raycluster.yaml").read_text())
    }
    cluster = docs["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["spec"]["rayVersion"] == RAY_PIN
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    head = cluster["spec"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    containers = {c["name"]: c for c in head["template"]["spec"]["containers"]}
    uri = next(
        e["value"] for e in containers["ray-head"]["env"] if e["name"] == "MLFLOW_TRACKING_URI"
    )
    assert node_local(uri)  # so every coordinator is kept on the head, beside the server
    assert "127.0.0.1" in containers["mlflow"]["command"]
    workers = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" in workers["resources"]["limits"]
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"ray.io/cluster": "raysim"}

    (job,) = yaml.safe_load_all((CLUSTER / "kuberay/rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["spec"]["entrypoint"].startswith("raysim run ")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    config = job["spec"]["entrypoint"].split()[2]
    assert (ROOT / config.removeprefix("/home/ray/raysim/")).is_file()
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{RAY_PIN}-py311" in dockerfile


def test_runtime_env_leaves_local_state_behind():
    env = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    assert env["working_dir"] == "."
    assert {".venv", "mlruns", "mlflow.db", "tune"} <= set(env["excludes"])
    assert node_local(env["env_vars"]["MLFLOW_TRACKING_URI"])


@pytest.mark.parametrize(
    ("uri", "local"),
    [
        ("sqlite:////tmp/x/mlflow.db", True),
        ("/tmp/mlruns", True),
        ("file:///tmp/mlruns", True),
        ("http://127.0.0.1:5000", True),
        ("http://localhost:5000", True),
        ("http://10.0.0.10:5000", False),
        ("https://mlflow.example.org", False),
        ("postgresql://user@localhost/mlflow", True),
        ("postgresql://user@db.internal/mlflow", False),
        ("databricks", False),
    ],
)
def test_which_stores_only_one_node_reaches(uri, local):
    assert node_local(uri) is local


def test_a_coordinator_away_from_a_node_local_store_is_refused_saying_what_to_set():
    check_store_node("http://10.0.0.10:5000", None, "b" * 56)  # every node reaches it
    check_store_node("sqlite:////x/mlflow.db", "a" * 56, "a" * 56)  # beside it
    with pytest.raises(ConfigError, match=r"local to node a+.*on node b+.*tracking\.uri=http"):
        check_store_node("sqlite:////x/mlflow.db", "a" * 56, "b" * 56)


def test_a_store_inside_a_ray_jobs_temporary_copy_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_store_outlives_job(uri)  # not in a job: fine
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://x"}})
    )
    with pytest.raises(ConfigError, match="vanish with the job.*MLFLOW_TRACKING_URI=http"):
        check_store_outlives_job(uri)
    check_store_outlives_job("http://127.0.0.1:5000")
    check_store_outlives_job("sqlite:////elsewhere/mlflow.db")
    assert store_path("http://127.0.0.1:5000") is None

    # the personal-state store's default folder (relative) would be in the copy too
    def disk(folder: str):
        state = {"store": "disk", "dir": folder}
        return load_config(tiny(clients={"num": 20, "per_round": 5, "state": state}))

    with pytest.raises(ConfigError, match=r"personal-state store.*vanish.*clients\.state\.dir="):
        check_state_outlives_job(disk("raysim-states"))
    check_state_outlives_job(disk("/elsewhere/states"))


def test_coordinator_node_is_a_switch_that_leaves_results_alone():
    from raysim.state.checkpoint import config_hash

    cfg = load_config(tiny(coordinator={"node": "any"}))
    assert config_hash(cfg) == config_hash(load_config(tiny()))
    with pytest.raises(ConfigError, match="coordinator.node"):
        load_config(tiny(coordinator={"node": "head"}))


# --------------------------------------------------------------------------- a real cluster
def _mlflow_server(port: int, store: Path, env: dict[str, str]) -> subprocess.Popen:
    """The head's MLflow server, as cluster/start-head.sh starts it (``_healthy`` waits)."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--backend-store-uri",
         f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination",
         str(store / "mlartifacts")],
        env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except (OSError, http.client.HTTPException):  # not up yet
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mlflow server did not come up on port {port} (exit {proc.poll()})")


@pytest.mark.slow
@pytest.mark.matrix  # suite time: a multi-node cluster of its own
def test_jobs_on_a_multi_process_cluster_land_in_the_heads_mlflow(ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    from tests.loopback import RAY, can_hide_folders, free_port, loopback_cluster

    port = free_port()
    server = _mlflow_server(port, tmp_path, dict(os.environ))  # starts while the cluster does
    uri = f"http://127.0.0.1:{port}"
    # a folder the GPU node does not share with the head: it sees an empty one of its own there
    hidden = tmp_path / "node-local" if can_hide_folders() else None
    try:
        with loopback_cluster(
            head_cpus=2, worker_cpus=2, worker_gpus=1, node_local=hidden
        ) as cluster:
            _healthy(server, port)

            def submit(*entrypoint: str) -> subprocess.CompletedProcess:
                for _ in range(30):  # the head's job agent may still be starting
                    proc = cluster.run(
                        RAY, "job", "submit", f"--address={cluster.dashboard}",
                        "--runtime-env", "cluster/runtime_env.yaml", "--", *entrypoint,
                        cwd=ROOT, timeout=400,
                    )  # fmt: skip
                    if "No available agent" not in proc.stdout + proc.stderr:
                        break
                    time.sleep(2)
                return proc

            small = ["rounds=2", "clients.per_round=4", "workers.count=4", "workers.num_cpus=0",
                     "workers.num_gpus=0.25", f"tracking.uri={uri}"]  # fmt: skip
            # Ditto's personal models in a store both nodes see: the coordinator (head) and the
            # workers (GPU node) write and read each other's files; the end names the folder
            shared = tmp_path / "shared"
            personal = ["algorithm.name=ditto", "clients.state.store=disk"]
            job = submit("raysim", "run", "examples/quickstart.yaml", *small, *personal,
                         f"clients.state.dir={shared}", "tracking.experiment=loopback",
                         "--address", "auto")  # fmt: skip
            assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
            (store,) = shared.iterdir()
            assert (store / "STORE.json").is_file() and list(store.glob("*/*.safetensors"))
            assert f"personal-state store: {store}\n" in job.stdout
            client = MlflowClient(uri)
            (run,) = client.search_runs([client.get_experiment_by_name("loopback").experiment_id])
            assert run.info.status == "FINISHED"
            assert len(client.get_metric_history(run.info.run_id, "accuracy")) == 2
            artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
            assert {"weights.safetensors", "config.yaml", "placement.json"} <= artifacts
            placement = client.download_artifacts(run.info.run_id, "placement.json", str(tmp_path))
            placed = json.loads(Path(placement).read_text())
            assert len(placed["workers"]) == 4  # 4 × 0.25 of the one GPU, all on its node
            (gpu_node,) = {w["node_id"] for w in placed["workers"]}
            assert {tuple(w["gpu_ids"]) for w in placed["workers"]} == {("0",)}
            assert all(w["cuda_visible_devices"] == "0" for w in placed["workers"])
            # the coordinator is on the other node, the head: beside the store it writes
            assert placed["coordinator_node"] != gpu_node
            assert run.data.tags["raysim.nodes"] == "1"

            sweep = submit(
                "raysim", "tune", "examples/tune-async.yaml", *small, "clients.num=10",
                "workers.count=1", "eval.every=1", "tune.num_samples=1", "tune.scheduler=fifo",
                "tune.space={algorithm.buffer_size: {grid: [2, 4]}}",
                "tracking.experiment=loopback-sweep", "--address", "auto",
                "--storage", str(tmp_path / "tune"),
            )  # fmt: skip
            assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-2000:]
            exp = client.get_experiment_by_name("loopback-sweep").experiment_id
            runs = client.search_runs([exp])
            assert len(runs) == 3  # the sweep's parent and its two trials
            assert {r.info.status for r in runs} == {"FINISHED"}
            assert "best_config.yaml" in {
                a.path
                for a in client.list_artifacts(
                    next(r for r in runs if "mlflow.parentRunId" not in r.data.tags).info.run_id
                )
            }

            # the default store would be inside the job's temporary copy: one line, nothing run
            lost = submit("env", "-u", "MLFLOW_TRACKING_URI", "raysim", "run",
                          "examples/quickstart.yaml", "--address", "auto")  # fmt: skip
            assert lost.returncode != 0
            assert "would vanish with the job" in lost.stdout
            assert "Traceback" not in lost.stdout
            if hidden is None:
                # a node's own disk is simulated by a mount namespace, which this machine does
                # not allow (unshare --mount needs root or user namespaces); the refusal itself
                # is tested in process (test_state_store.py)
                pytest.skip(
                    "this machine allows no mount namespace (unshare --mount) to give a node "
                    "a folder of its own; all the assertions above passed"
                )
            # a store the workers' node does not see (the coordinator makes it on the head,
            # beside the tracking store): one line naming the setting, no file written
            apart = submit("raysim", "run", "examples/quickstart.yaml", *small, *personal,
                           f"clients.state.dir={hidden / 'states'}",
                           "tracking.experiment=loopback-apart", "--address", "auto")  # fmt: skip
            assert apart.returncode != 0
            # one line (ray job submit repeats the job's last lines when it fails)
            said = {ln for ln in apart.stdout.splitlines() if ln.startswith("raysim: error")}
            assert len(said) == 1, apart.stdout[-3000:]
            (said,) = said
            assert "is not on this node" in said
            assert "clients.state.dir" in said and "Traceback" not in apart.stdout
            assert not list((hidden / "states").rglob("*.safetensors"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    # only what the test started was stopped: the test session's own Ray still answers
    assert ray_cluster.get(ray_cluster.remote(lambda: 7).remote()) == 7
