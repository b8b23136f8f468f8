"""The spec records that the cost model memoises on keep their cached hash."""
import copy
import pickle

from megatron_auto.plan import LayerStrategy
from megatron_auto.serde import CachedHash
from megatron_auto.specs import load_cluster, load_model, TrainingSpec
from megatron_auto.specs.profiles import ClusterProfile, MeasuredCosts, ModelProfile
from megatron_auto.specs.model import LayerSpec, ModelSpec
from megatron_auto.specs.cluster import ClusterSpec


def test_every_cached_hash_record_uses_the_cached_method():
    for record in (LayerSpec, ModelSpec, ClusterSpec, TrainingSpec, LayerStrategy, ClusterProfile,
                   ModelProfile, MeasuredCosts):
        assert record.__hash__ is CachedHash.__hash__, record.__name__


def test_hash_is_computed_once_and_equal_records_hash_alike():
    model = load_model("gpt3-1.7b")
    first = hash(model)
    assert model.__dict__["_cached_hash"] == first
    assert hash(load_model("gpt3-1.7b")) == first


def test_pickled_and_copied_records_drop_the_cached_hash():
    cluster = load_cluster("dgx-a100-80gb", 2)
    hash(cluster)
    for clone in (pickle.loads(pickle.dumps(cluster)), copy.deepcopy(cluster), copy.copy(cluster)):
        assert "_cached_hash" not in clone.__dict__
        assert clone == cluster and hash(clone) == hash(cluster)
