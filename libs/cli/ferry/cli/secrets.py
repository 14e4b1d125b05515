"""The secrets a cluster runs on, made once into one folder (mode 0700, files 0600).

    store.keys          the checkpoint store's keyring (ferry.store.keys)
    nats/USER.json      each service's NATS user and password (ferry.common.natsauth)
    env.key, env.pub    the key pair job environments are sealed to (ferry.common.sealing):
                        the private half for the nodes' checkpointers, the public one for the API

`ferry up` makes what is missing in <data-dir>/secrets; `ferry keys init DIR` makes the same for
a cluster deployed otherwise (Kubernetes Secrets, Nomad variables); `ferry keys rotate` adds a new
current store key.
"""

from __future__ import annotations

from pathlib import Path

from ferry.common.natsauth import NatsCreds, new_password, read_creds, users_for
from ferry.common.sealing import encode_key, new_key_pair
from ferry.store.keys import KeyRing, load_keyring, write_private

STORE_KEYS = "store.keys"


def ensure_store_keys(folder: Path) -> Path:
    path = folder / STORE_KEYS
    if not path.exists():
        write_private(path, KeyRing.generate().to_json())
    return path


def rotate_store_keys(path: Path) -> KeyRing:
    ring = load_keyring(path).rotated()
    write_private(path, ring.to_json())
    return ring


def ensure_env_keys(folder: Path) -> None:
    private, public = folder / "env.key", folder / "env.pub"
    if not private.exists() or not public.exists():
        key, pub = new_key_pair()
        write_private(private, encode_key(key))
        write_private(public, encode_key(pub))


def creds_file(folder: Path, user: str) -> Path:
    return folder / "nats" / f"{user}.json"


def ensure_nats_users(folder: Path, nodes: list[str] | None) -> dict[str, str]:
    """Each user's password, made for those that have none yet."""
    passwords = {}
    for user in users_for(nodes):
        path = creds_file(folder, user)
        if not path.exists():
            write_private(path, NatsCreds(user=user, password=new_password()).model_dump_json() + "\n")
        passwords[user] = read_creds(path).password
    return passwords


def ensure_secrets(folder: Path, nodes: list[str] | None) -> dict[str, str]:
    """Makes what is missing; returns the NATS users' passwords (for the server's configuration)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    ensure_store_keys(folder)
    ensure_env_keys(folder)
    return ensure_nats_users(folder, nodes)


def secret_key(rel: Path) -> str:
    """A file of the secrets folder as a Kubernetes Secret key: nats/api.json -> nats-api.json."""
    return "-".join(rel.parts).replace("@", ".")


def secret_items(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` but the CA's key, under ``secret_key`` names."""
    return {secret_key(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "ca.key" and not p.name.startswith(".")}


def kubernetes_secret(folder: Path, name: str, namespace: str) -> str:
    """A Secret (YAML) of ``secret_items``."""
    import base64

    import yaml

    data = {k: base64.b64encode(v).decode() for k, v in secret_items(folder).items()}
    doc = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "ferry"}},
           "data": data}
    return yaml.safe_dump(doc, sort_keys=False)
