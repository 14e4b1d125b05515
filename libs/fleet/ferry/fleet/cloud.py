"""What the providers other than ``local`` share: the offers they were configured with, how they
tag and name the nodes they launch, the script a new node boots with, and how a cloud's "no" is
told from a cloud that cannot be asked.

A cloud's API lists its instance types but not what this cluster may use, nor their prices in a
form worth trusting over the pricing service's feeds: the offers come from the configuration
(``instance_types``, ``ferry.common.config``), and a provider refuses any other before asking.
"""

from dataclasses import dataclass
from pathlib import Path

from ferry.common.cluster import InstanceTypeSpec
from ferry.fleet.provider import InstanceType, LaunchRefused, ProviderError

# the tags (labels) every launched node carries: which cluster, which Ferry node
CLUSTER_TAG = "ferry-cluster"
NODE_TAG = "ferry-node"
TYPE_TAG = "ferry-offer"


@dataclass(frozen=True)
class CloudConfig:
    """A provider's settings (``Settings.provider_*``), gathered by ``ferry.fleet.providers``."""

    cluster: str = "ferry"
    types: tuple[InstanceTypeSpec, ...] = ()
    region: str = ""
    project: str = ""
    group: str = ""
    endpoint: str = ""
    image: str = ""
    network: str = ""
    user_data: Path | None = None
    token_file: Path | None = None
    timeout_s: float = 600.0
    poll_s: float = 2.0

    def offers(self) -> list[InstanceType]:
        return [InstanceType.of(t) for t in self.types]

    def spec(self, offer: InstanceType) -> InstanceTypeSpec:
        """The configured type of ``offer``: a launch of anything else is refused before asking."""
        for t in self.types:
            if t.key == offer.key:
                return t
        known = ", ".join(sorted(t.key for t in self.types)) or "none"
        raise LaunchRefused(f"this cluster offers no {offer.key} (its instance_types: {known})")

    def boot_script(self, node_id: str) -> str:
        """The script the node boots with (``provider_user_data``, ``{node_id}`` replaced): it
        installs and starts the node's Ferry services with their own credentials."""
        if self.user_data is None:
            return ""
        try:
            return self.user_data.read_text().replace("{node_id}", node_id)
        except OSError as exc:
            raise ProviderError(f"provider_user_data {self.user_data}: {exc.strerror or exc}") from exc

    def token(self) -> str:
        if self.token_file is None:
            raise ProviderError("set provider_token_file (FERRY_PROVIDER_TOKEN_FILE): the API's bearer token")
        try:
            return self.token_file.read_text().strip()
        except OSError as exc:
            raise ProviderError(f"provider_token_file {self.token_file}: {exc.strerror or exc}") from exc

    def tags(self, node_id: str, offer: InstanceType) -> dict[str, str]:
        return {CLUSTER_TAG: self.cluster, NODE_TAG: node_id, TYPE_TAG: offer.key.replace("/", "_")}


def require(value: str, setting: str, provider: str) -> str:
    if not value:
        raise ProviderError(f"the {provider} provider needs {setting} (FERRY_{setting.upper()})")
    return value
