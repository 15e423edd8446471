"""The local Ray instance of the tests and the demo listens on 127.0.0.1 only, with token
authentication on. Real Ray (the session's ``ray_local``), real sockets read from /proc."""

from __future__ import annotations

import os
import socket
import sys

import grpc
import pytest

from orchestrator.cluster.local_ray import (
    LOOPBACK,
    _hex_to_ip,
    descendants,
    is_loopback,
    listening_sockets,
    local_ray_init_kwargs,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.parametrize(("column", "host", "loopback"), [
    ("0100007F", "127.0.0.1", True),
    ("00000000", "0.0.0.0", False),
    ("020200C0", "192.0.2.2", False),
    ("0000000000000000FFFF00000100007F", "::ffff:127.0.0.1", True),
    ("00000000000000000000000001000000", "::1", True),
    ("00000000000000000000000000000000", "::", False),
])
def test_proc_net_addresses_parse(column, host, loopback):
    assert _hex_to_ip(column) == host
    assert is_loopback(host) is loopback


def test_listening_sockets_finds_a_listener_of_this_process():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        s.listen()
        port = s.getsockname()[1]
        found = listening_sockets({os.getpid()})
    assert (os.getpid(), LOOPBACK, port) in {(pid, host, p) for pid, host, p, _ in found}


def test_init_kwargs_select_a_fresh_loopback_instance():
    kwargs = local_ray_init_kwargs(num_cpus=3, log_to_driver=False)
    assert kwargs["address"] == "local" and kwargs["num_cpus"] == 3
    assert kwargs["_node_ip_address"] == LOOPBACK and kwargs["log_to_driver"] is False
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_every_listener_of_the_instance_is_on_loopback(ray_local):
    ray = ray_local

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    probe = Probe.remote()
    actor_pid = ray.get(probe.pid.remote())
    assert ray.util.get_node_ip_address() == LOOPBACK
    # ray.init(address="local") starts the GCS and the raylet as children of the driver;
    # workers and agents are children of the raylet.
    found = listening_sockets(descendants({os.getpid()}))
    names = {name for *_, name in found}
    assert {"gcs_server", "raylet"} <= names, found
    assert actor_pid in {pid for pid, *_ in found}, found
    assert [s for s in found if not is_loopback(s[1])] == []
    ray.kill(probe)


def test_token_authentication_is_on(ray_local):
    from ray._private.authentication.authentication_utils import is_token_auth_enabled
    from ray._raylet import AuthenticationTokenLoader
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    ray = ray_local
    assert is_token_auth_enabled()
    gcs = ray._private.worker.global_worker.node.gcs_address
    assert gcs.startswith(f"{LOOPBACK}:")
    token = tuple(AuthenticationTokenLoader.instance().get_token_for_http_header().items())
    assert token, "no token for an instance with token authentication on"
    request = gcs_service_pb2.GetAllNodeInfoRequest()
    with grpc.insecure_channel(gcs) as channel:  # a plain channel: no Ray interceptor
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        for metadata in ((), (("authorization", "Bearer not-the-token"),)):
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetAllNodeInfo(request, timeout=30, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.GetAllNodeInfo(request, timeout=30, metadata=token)
    assert len(reply.node_info_list) >= 1
