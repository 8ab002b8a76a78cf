"""The DRA DeviceClasses the bridge honours, and what each becomes in Slurm.

A pod asks for devices of a DeviceClass by its implicit extended-resource name,
`deviceclass.resource.kubernetes.io/<class>` (KEP-5004). The operator names the
classes the bridge honours and their Slurm meaning in one setting,
`DRA_DEVICE_CLASSES` (docs/dra.md):

    dra.cpu=cpu,gpu.example.com=gpu,gpu.nvidia.com=gpu,gpu.h100.example.com=gpu:h100

- `<class>=cpu`: the devices are CPUs; the pod's count becomes the job's `cpus_per_task`,
  and the claim names the cores Slurm allocated;
- `<class>=<gres>` or `<class>=<gres>:<type>`: the devices are a GRES; the count becomes
  `tres_per_node: gres/<gres>[:<type>]=N`, and the claim names the GRES indexes Slurm
  allocated. Untyped is the default for GPUs: an untyped request matches typed GRES too,
  and the GPUs node sync registers are untyped.

Pure: parsed once at start by the worker and the webhook (and read by `explain`), so
what the webhook admits is what the worker submits. Empty means no class is honoured.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from bridge import keys
from bridge.quantity import whole_cpus

SETTING = "DRA_DEVICE_CLASSES"
CPU = "cpu"
GPU = "gpu"
# The class's name ends an extended-resource name (a qualified name), whose part after "/"
# has at most 63 characters; a DeviceClass name is a lowercase DNS subdomain.
_CLASS_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,61}[a-z0-9])?")
# What Slurm accepts in `gres/<name>:<type>=N`: no ":", "=", "," or "/" (MIG types have dots).
_GRES_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class DeviceClassesError(ValueError):
    """The setting does not parse; the message says which part and how to write it."""


@dataclass(frozen=True, order=True)
class Gres:
    """A Slurm generic resource, typed or not (`gpu`, `gpu:h100`)."""

    name: str
    type: str = ""

    def __str__(self) -> str:
        return f"{self.name}:{self.type}" if self.type else self.name

    def per_node(self, count: int) -> str:
        """One `tres_per_node` entry."""
        return f"gres/{self}={count}"

    def matches(self, name: object, type_: object) -> bool:
        """Is a GRES Slurm reports (`/resources/{job}`: name, type) one this asks for?

        An untyped request is met by any type of its name, as Slurm allocates it.
        """
        return name == self.name and (not self.type or type_ == self.type)


# What device-plugin resources ask Slurm for: untyped GPUs (upstream's rule, unchanged).
DEVICE_PLUGIN_GRES: Mapping[str, Gres] = {name: Gres(GPU) for name in keys.GPU_RESOURCES}


@dataclass(frozen=True)
class DeviceClass:
    """One honoured DeviceClass: CPUs (`gres` None) or a GRES."""

    name: str
    gres: Gres | None = None

    @property
    def is_cpu(self) -> bool:
        return self.gres is None

    @property
    def resource(self) -> str:
        """The extended-resource name a container requests it by."""
        return keys.DRA_RESOURCE_PREFIX + self.name

    @property
    def slurm(self) -> str:
        """What Slurm is asked for, as `explain` and messages show it."""
        return "cpus_per_task" if self.gres is None else f"tres_per_node gres/{self.gres}"

    def __str__(self) -> str:
        return f"{self.name}={CPU if self.gres is None else self.gres}"


@dataclass(frozen=True)
class DeviceClasses:
    """The honoured classes, in the setting's order (sorted by name once parsed)."""

    classes: tuple[DeviceClass, ...] = ()

    def __str__(self) -> str:
        """The setting's compact form; parsing it gives the same classes."""
        return ",".join(str(c) for c in self.classes)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.classes]

    def get(self, name: str) -> DeviceClass | None:
        return next((c for c in self.classes if c.name == name), None)

    def of_resource(self, resource: str) -> DeviceClass | None:
        """The class a `deviceclass.resource.kubernetes.io/<class>` name asks for, if honoured."""
        if not resource.startswith(keys.DRA_RESOURCE_PREFIX):
            return None
        return self.get(resource.removeprefix(keys.DRA_RESOURCE_PREFIX))

    @property
    def cpu_resources(self) -> list[str]:
        """Extended-resource names whose count is CPUs."""
        return [c.resource for c in self.classes if c.is_cpu]

    def gres_of(self, resource: str) -> Gres | None:
        """The GRES a resource name asks Slurm for: a device-plugin GPU or a GRES class."""
        honoured = self.of_resource(resource)
        return DEVICE_PLUGIN_GRES.get(resource) or (honoured.gres if honoured else None)

    def gpu_drivers(self) -> frozenset[str]:
        """Drivers whose devices node sync counts as GPUs: the classes Slurm counts as `gpu`.

        By the mapping convention (docs/dra.md) a class is named as its driver.
        """
        return frozenset(c.name for c in self.classes if c.gres is not None and c.gres.name == GPU)

    def honoured(self) -> str:
        """The configured classes, for messages."""
        listed = ", ".join(sorted(self.names)) or "none"
        return f"{listed}; the operator sets them in {SETTING}"

    # -- a job's resources (per node: a group's largest pod for every resource) --------

    def per_node_gres(self, per_node: Mapping[str, Fraction]) -> dict[Gres, int]:
        """Per GRES, the largest count any resource asking for it needs on one node."""
        counts: dict[Gres, int] = {}
        for resource, quantity in per_node.items():
            gres = self.gres_of(resource)
            if gres is not None and quantity > 0:
                counts[gres] = max(counts.get(gres, 0), whole_cpus(quantity))
        return counts

    def tres_per_node(self, per_node: Mapping[str, Fraction]) -> str | None:
        """`tres_per_node` for these per-node resources: `gres/gpu=2`, `gres/gpu:h100=1,gres/nic=1`."""
        counts = self.per_node_gres(per_node)
        return ",".join(g.per_node(n) for g, n in sorted(counts.items())) or None

    def gres_problems(self, per_node: Mapping[str, Fraction]) -> list[str]:
        """Why one job cannot ask every node for these GRES: one name asked with different types.

        A pod may use one resource name per GRES name (bridge.dra.dra_problems); this
        catches a group whose pods use different ones (`gres/gpu` and `gres/gpu:h100`).
        """
        by_name: dict[str, set[Gres]] = {}
        for gres in self.per_node_gres(per_node):
            by_name.setdefault(gres.name, set()).add(gres)
        return [
            f"the pods ask for {' and '.join('gres/' + str(g) for g in sorted(asked))} on each node: one "
            "Slurm job asks every node for the same GRES, so the pods of a group must request "
            f"{name} through one resource name"
            for name, asked in sorted(by_name.items())
            if len(asked) > 1
        ]

    def cpus(self, per_node: Mapping[str, Fraction]) -> Fraction:
        """CPUs one node needs: `cpu` or a CPU class (a pod uses one of them, dra_problems)."""
        return max((per_node.get(r, Fraction(0)) for r in ["cpu", *self.cpu_resources]), default=Fraction(0))


def _device_class(entry: str) -> DeviceClass:
    name, equals, slurm = (part.strip() for part in entry.partition("="))
    if not equals:
        raise DeviceClassesError(
            f'"{entry}" has no "=": write <DeviceClass>=cpu or <DeviceClass>=<gres>[:<type>]'
        )
    if not _CLASS_NAME.fullmatch(name):
        raise DeviceClassesError(
            f'"{name}" is not a DeviceClass name that pods can request (lowercase letters, digits, "-" and '
            '".", at most 63 characters)'
        )
    if slurm == CPU:
        return DeviceClass(name)
    gres_name, colon, gres_type = slurm.partition(":")
    if gres_name == CPU:
        raise DeviceClassesError(f'{name}: "{slurm}": cpu takes no type (CPUs are counted in cpus_per_task)')
    if not _GRES_NAME.fullmatch(gres_name):
        raise DeviceClassesError(
            f'{name}: "{slurm}" is not cpu or a GRES name (letters, digits, "_"), optionally with ":<type>"'
        )
    if colon and not _GRES_TYPE.fullmatch(gres_type):
        raise DeviceClassesError(
            f'{name}: "{gres_type}" is not a GRES type (letters, digits, "_", "-", "."; no ":", "=" or ",")'
        )
    return DeviceClass(name, Gres(gres_name, gres_type))


def parse_device_classes(text: str) -> DeviceClasses:
    """`class=cpu` / `class=gres[:type]` entries, comma-separated; empty: no class is honoured."""
    classes: dict[str, DeviceClass] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        device_class = _device_class(entry)
        if device_class.name in classes:
            raise DeviceClassesError(f"{device_class.name} is named twice")
        classes[device_class.name] = device_class
    return DeviceClasses(tuple(sorted(classes.values(), key=lambda c: c.name)))


def device_classes(entries: Iterable[DeviceClass]) -> DeviceClasses:
    """The classes given in code, in the parsed form (sorted by name)."""
    return parse_device_classes(",".join(str(e) for e in entries))


# Today's fixed list, with today's meaning: the CPU DRA driver, and two GPU drivers as untyped GPUs.
DEFAULT_DEVICE_CLASSES = device_classes(
    [
        DeviceClass(keys.DRA_CPU_CLASS),
        DeviceClass("gpu.example.com", Gres(GPU)),
        DeviceClass("gpu.nvidia.com", Gres(GPU)),
    ]
)
