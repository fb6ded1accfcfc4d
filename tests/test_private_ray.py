"""A run's private Ray: token authentication on, every listener on loopback (issue 56, item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

#: Another process on the machine calling the run's GCS with a token (argv[2]).
INTRUDER = textwrap.dedent(
    """
    import sys
    from ray._raylet import GcsClient
    try:
        GcsClient(address=sys.argv[1], cluster_id=None).internal_kv_get(b"k", b"", timeout=10)
    except Exception as e:
        print("REFUSED", type(e).__name__)
    else:
        print("ADMITTED")
    """
)

#: In a fresh process (its own private Ray): start it the way a run does, give it an actor and a
#: task, then list every listening socket of the driver and of the processes it started.
PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil, ray
    from raysim.launch.private_ray import ensure_ray

    ensure_ray(num_cpus=1)

    @ray.remote
    class Echo:
        def ping(self):
            return os.environ.get("RAY_AUTH_MODE"), bool(os.environ.get("RAY_AUTH_TOKEN"))

    echo = Echo.remote()
    seen = ray.get(echo.ping.remote())
    time.sleep(1)  # the agents' servers are up by now
    listening = []
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            for c in proc.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    listening.append([proc.name(), c.laddr.ip, c.laddr.port])
        except psutil.NoSuchProcess:
            pass
    gcs = ray.get_runtime_context().gcs_address
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    for token in ("0" * 64, os.environ["RAY_AUTH_TOKEN"]):  # another token, then the run's
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        call = subprocess.run([sys.executable, "-c", sys.argv[1], gcs], env=env, timeout=60,
                              capture_output=True, text=True)
        print("INTRUDER " + call.stdout.strip())
    print("FACTS " + json.dumps({"listening": listening, "worker": seen, "gcs": gcs,
                                 "driver": os.environ.get("RAY_AUTH_MODE")}))
    ray.shutdown()
    """
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _probe() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, INTRUDER], capture_output=True, text=True, env=_clean_env(),
        timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("FACTS "))
    facts = json.loads(line.removeprefix("FACTS "))
    facts["calls"] = [
        ln.removeprefix("INTRUDER ")
        for ln in done.stdout.splitlines()
        if ln.startswith("INTRUDER ")
    ]
    return facts


def _loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def test_private_ray_listens_on_loopback_only_with_token_auth() -> None:
    facts = _probe()
    names = {name for name, _, _ in facts["listening"]}
    assert {"gcs_server", "raylet"} <= names, facts["listening"]  # the probe sees Ray's servers
    exposed = [entry for entry in facts["listening"] if not _loopback(entry[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert facts["driver"] == "token"
    assert facts["worker"] == ["token", True]  # Ray's workers run with the token too
    assert facts["gcs"].startswith("127.0.0.1:")
    assert facts["calls"] == ["REFUSED AuthenticationError", "ADMITTED"]  # only the run's token


def test_private_ray_auth_respects_the_users_choice(monkeypatch) -> None:
    from raysim.launch import private_ray as ray_start

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setattr(ray_start, "_refresh_ray_auth", lambda: None)
    monkeypatch.setattr(ray_start, "_TOKEN", [])
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    import pytest

    with pytest.warns(UserWarning, match="RAY_AUTH_MODE=disabled"):
        assert ray_start.private_ray_auth() == "disabled"
    assert "RAY_AUTH_TOKEN" not in os.environ

    monkeypatch.delenv("RAY_AUTH_MODE")
    assert ray_start.private_ray_auth() == "token"
    token = os.environ["RAY_AUTH_TOKEN"]
    assert len(token) == 64 and os.environ["RAY_AUTH_MODE"] == "token"
    assert ray_start.private_ray_auth() == "token" and os.environ["RAY_AUTH_TOKEN"] == token

    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-users-own")
    ray_start.private_ray_auth()
    assert os.environ["RAY_AUTH_TOKEN"] == "the-users-own"  # a user's token is kept
