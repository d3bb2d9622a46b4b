"""A model's own address (``GET <model>/endpoint``): how the server finds it, and who may ask."""

import asyncio

import pytest
import ray
from ray.serve._private.common import RequestProtocol
from ray.serve.schema import Target, TargetGroup

from twinkle.server.model.deployment import find_direct_url
from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"
PREFIX = "/api/v1/model/tiny/qwen3"


def test_endpoint_needs_a_key_and_is_null_without_ray_serve(tmp_path):
    server = local_server(tmp_path)

    async def scenario():
        async with client(server, who=None) as anonymous:
            denied = await anonymous.get(f"{MODEL}/endpoint")
        async with client(server) as alice:
            allowed = await alice.get(f"{MODEL}/endpoint")
        return denied, allowed

    denied, allowed = asyncio.run(scenario())
    assert denied.status_code == 401
    assert allowed.status_code == 200 and allowed.json() == {"direct_url": None}


def _group(app, port, *, ip="127.0.0.1", prefix=PREFIX, protocol=RequestProtocol.HTTP, n=1):
    targets = [
        Target(ip=ip, port=port + i, instance_id=f"i{i}", name=f"replica-{i}") for i in range(n)
    ]
    return TargetGroup(targets=targets, route_prefix=prefix, protocol=protocol, app_name=app)


class _Controller:
    def __init__(self, groups):
        self.groups = groups
        self.get_target_groups = self

    def remote(self, app_name):
        async def answer():
            return [g for g in self.groups if g.app_name in (app_name, "")]

        return answer()


@pytest.mark.parametrize(
    ("groups", "host", "expected"),
    [
        # Direct ingress: the application's single replica, on the configured host.
        ([_group("model", 30001)], "127.0.0.1", "http://127.0.0.1:30001"),
        # Bound to every interface: the node address the controller reports.
        ([_group("model", 30001, ip="10.1.2.3")], "0.0.0.0", "http://10.1.2.3:30001"),
        ([_group("model", 30001)], "::1", "http://[::1]:30001"),
        # Direct ingress off: only the proxies, which belong to no application.
        ([_group("", 8000, prefix="/")], "127.0.0.1", None),
        # Two replicas have no single address (a tenant's adapter lives on one of them).
        ([_group("model", 30001, n=2)], "127.0.0.1", None),
        # Another application's route, or gRPC: not this model's HTTP address.
        ([_group("model", 30001, prefix="/api/v1/model/other")], "127.0.0.1", None),
        ([_group("model", 40001, protocol=RequestProtocol.GRPC)], "127.0.0.1", None),
    ],
)
def test_find_direct_url(monkeypatch, groups, host, expected):
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace=None: _Controller(groups))
    assert asyncio.run(find_direct_url("model", PREFIX, host)) == expected


def test_find_direct_url_without_a_serve_controller_is_none(monkeypatch):
    def missing(name, namespace=None):
        raise ValueError(f"Failed to look up actor with name '{name}'")

    monkeypatch.setattr(ray, "get_actor", missing)
    assert asyncio.run(find_direct_url("model", PREFIX, "127.0.0.1")) is None
