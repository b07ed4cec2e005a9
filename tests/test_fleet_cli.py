"""`specwatch fleet accept`: its targets file and selector, the outcome table and summary, the exit status; and
the command against in-process daemons behind basic auth with one node down (the real daemons and
Prometheus's target list: tests/test_fleet_accept_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import bcrypt
import pytest

from specwatch.cli import main as cli_main
from specwatch.commands import fleet
from specwatch.commands._admin import BaselineAdmin
from specwatch.export.http import serve
from specwatch.export.webconfig import parse_web_config

from alerting_stack import free_port
from fakes import NEW, OLD
from test_fleet_accept import Node


def test_the_targets_file_takes_host_port_lines_comments_and_no_repeats(tmp_path: Path) -> None:
    path = tmp_path / "targets"
    path.write_text("# fleet\n\nnode-1:9400\n  node-2:9400   # rack 2\n[::1]:9400\nnode-1:9400\n")
    assert fleet.targets_from_file(str(path)) == ["node-1:9400", "node-2:9400", "[::1]:9400"]
    path.write_text("node-1:9400\nhttp://node-2:9400/metrics\n")
    with pytest.raises(fleet.UsageError, match=r"targets:2: 'http://node-2:9400/metrics' is not host:port"):
        fleet.targets_from_file(str(path))
    with pytest.raises(fleet.UsageError, match="cannot read --targets"):
        fleet.targets_from_file(str(tmp_path / "missing"))


def test_the_selector_takes_equality_matchers_only() -> None:
    assert fleet.parse_selector('job="specwatch"') == {"job": "specwatch"}
    assert fleet.parse_selector('{job="specwatch", env="prod"}') == {"job": "specwatch", "env": "prod"}
    for bad in ('job=~"spec.*"', "job=specwatch", ""):
        with pytest.raises(fleet.UsageError):
            fleet.parse_selector(bad)


def test_the_summary_counts_routes_by_outcome_and_unreachable_nodes() -> None:
    rows = [
        fleet.Row("a:1", "chat", "adopted"),
        fleet.Row("a:1", "code", "already"),
        fleet.Row("b:1", "chat", "refused", "it runs model 'old'"),
        fleet.Row("c:1", "chat", "unreachable", "connection refused"),
        fleet.Row("c:1", "code", "unreachable", "connection refused"),
    ]
    assert fleet.summary(rows) == ("adopted 1, already 1, refused 1, unreachable 1", False)
    assert fleet.summary(rows[:2]) == ("adopted 1, already 1, refused 0, unreachable 0", True)
    dry = [fleet.Row("a:1", "chat", "would_adopt")]
    assert fleet.summary(dry, dry_run=True) == (
        "adopted 0, already 0, refused 0, unreachable 0, would adopt 1 (dry run: nothing changed)",
        True,
    )


def test_flags_that_go_together(tmp_path: Path, capsys) -> None:
    targets = tmp_path / "targets"
    targets.write_text("127.0.0.1:9\n")
    base = ["fleet", "accept", "--model", NEW, "--targets", str(targets)]
    assert cli_main([*base, "--user", "ops"]) == 2
    assert "--user and --password-file go together" in capsys.readouterr().err
    assert cli_main([*base, "--cert-file", "c.pem"]) == 2
    assert "--cert-file and --key-file go together" in capsys.readouterr().err
    targets.write_text("# nobody\n")
    assert cli_main(base) == 2 and "no targets" in capsys.readouterr().err


@pytest.mark.slow
def test_the_fleet_accept_table_and_exit_status_with_one_node_down(tmp_path: Path, capsys) -> None:
    password = "fleet-operator"
    web = parse_web_config(
        {"basic_auth_users": {"ops": bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}},
        str(tmp_path / "web.yml"),
    )
    bumped, behind = Node(tmp_path / "a"), Node(tmp_path / "b")
    servers = []
    try:
        for node in (bumped, behind):
            node.run(120.0)
            admin = BaselineAdmin(lambda n=node: n.daemon.config, node.daemon)
            servers.append(serve("127.0.0.1:0", lambda n=node: n.daemon.snapshot, web, admin=admin))
        bumped.engine.bump(NEW, 0.48)
        bumped.run(45.0)
        secret = tmp_path / "password"
        secret.write_text(password + "\n")
        targets = tmp_path / "targets"
        down = f"127.0.0.1:{free_port()}"
        targets.write_text("".join(f"127.0.0.1:{s.port}\n" for s in servers) + down + "\n")
        argv = ["fleet", "accept", "--model", NEW, "--draft-length", "4", "--targets", str(targets)]
        argv += ["--user", "ops", "--password-file", str(secret), "--timeout", "20"]

        assert cli_main([*argv, "--dry-run"]) == 1
        out = capsys.readouterr().out
        assert out.splitlines()[-1].startswith("adopted 0, already 0, refused 1, unreachable 1, would adopt 1")
        assert bumped.stored() == {OLD: pytest.approx(0.6)}

        assert cli_main(argv) == 1
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[-1] == "adopted 1, already 0, refused 1, unreachable 1"
        row = {line.split()[0]: line for line in lines if line.startswith(("127.0.0.1", down))}
        assert "adopted" in row[f"127.0.0.1:{servers[0].port}"] and "0.4800 llama-3.3-8b" in out
        assert f"it runs model '{OLD}', not '{NEW}'" in row[f"127.0.0.1:{servers[1].port}"]
        assert "unreachable" in row[down] and "connection refused" in row[down]
        assert behind.stored() == {OLD: pytest.approx(0.6)}

        targets.write_text(f"127.0.0.1:{servers[0].port}\n")
        assert cli_main(argv) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "adopted 0, already 1, refused 0, unreachable 0"
        secret.write_text("wrong\n")
        assert cli_main(argv) == 1
        assert "HTTP 401" in capsys.readouterr().out
    finally:
        for server in servers:
            server.shutdown()
        bumped.close()
        behind.close()
