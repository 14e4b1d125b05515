"""The provider the settings name (``FERRY_PROVIDER``), or None.

- ``local``: ``ferry up --provider local`` (``ferry.fleet.local``), the cluster file's types;
- ``aws``: EC2's RunInstances (``ferry.fleet.aws``, boto3);
- ``gcp``: Compute Engine's instances (``ferry.fleet.gcp``);
- ``azure``: Azure's virtual machines (``ferry.fleet.azure``);
- ``slurm``: SLURM's power saving, ``scontrol ... state=power_up`` (``ferry.fleet.slurm``);
- ``kubernetes``: a Cluster API node group's replicas (``ferry.fleet.kube``).

All but ``local`` offer the configuration's ``instance_types`` (for SLURM and Kubernetes, each
names its nodes or node group in ``group``).
"""

from ferry.common.config import Settings
from ferry.common.errors import ConfigError
from ferry.fleet.azure import AzureProvider
from ferry.fleet.cloud import CloudConfig
from ferry.fleet.gcp import GcpProvider
from ferry.fleet.kube import KubeProvider
from ferry.fleet.local import LocalProvider
from ferry.fleet.provider import Provider
from ferry.fleet.slurm import SlurmProvider


def cloud_config(settings: Settings) -> CloudConfig:
    return CloudConfig(cluster=settings.cluster_name, types=tuple(settings.instance_types),
                       region=settings.provider_region, project=settings.provider_project,
                       group=settings.provider_group, endpoint=settings.provider_endpoint,
                       image=settings.provider_image, network=settings.provider_network,
                       user_data=settings.provider_user_data, token_file=settings.provider_token_file)


def make_provider(settings: Settings) -> Provider | None:
    if settings.provider == "":
        return None
    if settings.provider == "local":
        return LocalProvider(settings.fleet_dir or settings.data_dir / "fleet")
    if not settings.instance_types:
        raise ConfigError(f"the {settings.provider} provider launches only the instance_types of the "
                          "configuration (FERRY_INSTANCE_TYPES): none are set")
    config = cloud_config(settings)
    if settings.provider == "aws":
        try:
            from ferry.fleet.aws import AwsProvider  # boto3 is imported only where EC2 is used
        except ImportError as exc:
            raise ConfigError(f"the aws provider needs boto3 ({exc}): pip install 'ferry[aws]'") from exc
        return AwsProvider(config)
    if settings.provider == "gcp":
        return GcpProvider(config)
    if settings.provider == "azure":
        return AzureProvider(config)
    if settings.provider == "slurm":
        return SlurmProvider(config)
    return KubeProvider(config)
