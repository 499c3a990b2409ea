"""Guards the public surface: torch.distributed's functional names, argument names and order."""
from __future__ import annotations

import inspect

import collcomm

# name -> torch 2.x positional parameter names (prefix)
TORCH = {
    "init_process_group": ["backend", "init_method", "timeout", "world_size", "rank", "store"],
    "is_initialized": [], "destroy_process_group": ["group"], "new_group": ["ranks", "timeout"],
    "get_rank": ["group"], "get_world_size": ["group"], "get_backend": ["group"],
    "barrier": ["group", "async_op", "device_ids"],
    "broadcast": ["tensor", "src", "group", "async_op", "group_src"],
    "all_reduce": ["tensor", "op", "group", "async_op"],
    "reduce": ["tensor", "dst", "op", "group", "async_op", "group_dst"],
    "all_gather": ["tensor_list", "tensor", "group", "async_op"],
    "all_gather_into_tensor": ["output_tensor", "input_tensor", "group", "async_op"],
    "reduce_scatter": ["output", "input_list", "op", "group", "async_op"],
    "reduce_scatter_tensor": ["output", "input", "op", "group", "async_op"],
    "all_to_all": ["output_tensor_list", "input_tensor_list", "group", "async_op"],
    "all_to_all_single": ["output", "input", "output_split_sizes", "input_split_sizes", "group", "async_op"],
    "gather": ["tensor", "gather_list", "dst", "group", "async_op", "group_dst"],
    "scatter": ["tensor", "scatter_list", "src", "group", "async_op", "group_src"],
    "send": ["tensor", "dst", "group", "tag"], "recv": ["tensor", "src", "group", "tag"],
    "isend": ["tensor", "dst", "group", "tag"], "irecv": ["tensor", "src", "group", "tag"],
    "P2POp": ["op", "tensor", "peer", "group", "tag"], "batch_isend_irecv": ["p2p_op_list"],
    "get_global_rank": ["group", "group_rank"], "get_group_rank": ["group", "global_rank"],
    "get_process_group_ranks": ["group"],
    "broadcast_object_list": ["object_list", "src", "group"],
    "all_gather_object": ["object_list", "obj", "group"],
    "gather_object": ["obj", "object_gather_list", "dst", "group"],
    "scatter_object_list": ["scatter_object_output_list", "scatter_object_input_list", "src", "group"],
    "send_object_list": ["object_list", "dst", "group"],
    "recv_object_list": ["object_list", "src", "group"],
    "all_reduce_object": ["obj", "op", "group"], "reduce_object": ["obj", "op", "dst", "group"],
}
OTHER = ["ReduceOp", "Work", "ProcessGroup", "GroupMember", "NON_GROUP_MEMBER", "CollcommError",
         "InvalidArgumentError", "CommTimeoutError", "PeerLostError", "MismatchError"]


def test_all_names_exported_and_callable():
    missing = [n for n in list(TORCH) + OTHER if n not in collcomm.__all__]
    assert missing == []
    for name in collcomm.__all__:
        assert hasattr(collcomm, name), name
    for name in TORCH:
        assert callable(getattr(collcomm, name)), name


def test_signatures_match_torch():
    for name, params in TORCH.items():
        obj = getattr(collcomm, name)
        sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
        got = [p for p in sig.parameters if p != "self"][:len(params)]
        assert got == params, f"{name}: {got} != {params}"


def test_defaults_like_torch():
    sig = inspect.signature(collcomm.all_reduce)
    assert sig.parameters["op"].default is collcomm.ReduceOp.SUM
    assert sig.parameters["async_op"].default is False
    assert inspect.signature(collcomm.recv).parameters["src"].default is None


def test_group_member_and_ops():
    assert collcomm.GroupMember.NON_GROUP_MEMBER is collcomm.NON_GROUP_MEMBER
    assert collcomm.GroupMember.WORLD is None or isinstance(collcomm.GroupMember.WORLD, collcomm.ProcessGroup)
    for op in ("SUM", "PRODUCT", "PROD", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR"):
        assert hasattr(collcomm.ReduceOp, op)
    assert issubclass(collcomm.InvalidArgumentError, ValueError)
