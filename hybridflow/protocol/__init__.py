"""The data container passed between the controller and the workers.

``DataProto`` (rows of tensors, rows of numpy values, batch facts), its one-row
``DataProtoItem``, the not-yet-computed ``DataProtoFuture`` and the module helpers, with
verl's names and semantics: ``from verl.protocol import X`` becomes
``from hybridflow.protocol import X``.
"""

from hybridflow.protocol.batch_ops import (
    collate_fn,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    unpad_dataproto,
)
from hybridflow.protocol.dataproto import AUTO_PADDING_KEY, DataProto, DataProtoItem
from hybridflow.protocol.errors import (
    DataProtoError,
    DataProtoKeyError,
    DataProtoTypeError,
)
from hybridflow.protocol.future import DataProtoFuture
from hybridflow.protocol.merge import (
    deep_equal,
    list_of_dict_to_dict_of_list,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)
from hybridflow.protocol.serialization import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)

__all__ = [
    "AUTO_PADDING_KEY",
    "DataProto",
    "DataProtoError",
    "DataProtoFuture",
    "DataProtoItem",
    "DataProtoKeyError",
    "DataProtoTypeError",
    "collate_fn",
    "deep_equal",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
]
