"""Local doubles of the APIs the providers call (no cloud is reachable from CI, no kube-apiserver
can be installed): Compute Engine's instances and zone operations, Azure Resource Manager's
virtual machines, and Cluster API's MachineDeployments and Machines as a kube-apiserver serves
them (with the Cluster API controller's part: replicas become machines, then nodes),
served over HTTP on 127.0.0.1 with the documented paths, request shapes, answers and error
formats. Each checks the bearer token and the fields a real API would reject a request without,
has a capacity per (type, zone) to run out of, and can preempt an instance as the cloud would.
Every request is kept (``requests``) for the tests to read."""

from __future__ import annotations

import itertools
from typing import Any

from aiohttp import web

TOKEN = "test-token"


def _error(status: int, code: str, message: str, gcp: bool) -> web.Response:
    body = ({"error": {"code": status, "message": message, "errors": [{"reason": code, "message": message}]}}
            if gcp else {"error": {"code": code, "message": message}})
    return web.json_response(body, status=status)


class CloudDouble:
    def __init__(self, capacity: dict[tuple[str, str], int]) -> None:
        self.capacity = dict(capacity)  # (type, zone) -> instances it can still start
        self.gcp: dict[str, dict[str, Any]] = {}  # name -> instance
        self.gcp_ops: dict[str, dict[str, Any]] = {}
        self.gcp_hold = False  # instances stay PROVISIONING while set (a launch that takes long)
        self.azure: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}  # Cluster API MachineDeployments by name
        self.machines: dict[str, dict[str, Any]] = {}
        self.failing: set[str] = set()  # groups whose new machines fail
        self.requests: list[tuple[str, str, Any]] = []
        self._ids = itertools.count(1)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(middlewares=[self._auth])
        base = "/compute/v1/projects/{project}/zones/{zone}"
        app.router.add_post(f"{base}/instances", self.gcp_insert)
        app.router.add_get(f"{base}/instances", self.gcp_list)
        app.router.add_get(f"{base}/instances/{{name}}", self.gcp_get)
        app.router.add_delete(f"{base}/instances/{{name}}", self.gcp_delete)
        app.router.add_get(f"{base}/operations", self.gcp_ops_list)
        app.router.add_get(f"{base}/operations/{{op}}", self.gcp_op)
        vms = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines"
        app.router.add_get(vms, self.az_list)
        app.router.add_put(f"{vms}/{{name}}", self.az_put)
        app.router.add_get(f"{vms}/{{name}}", self.az_get)
        app.router.add_delete(f"{vms}/{{name}}", self.az_delete)
        capi = "/apis/cluster.x-k8s.io/v1beta1/namespaces/{ns}"
        app.router.add_get(f"{capi}/machinedeployments/{{name}}", self.md_get)
        app.router.add_patch(f"{capi}/machinedeployments/{{name}}", self.md_patch)
        app.router.add_get(f"{capi}/machines", self.machines_list)
        app.router.add_patch(f"{capi}/machines/{{name}}", self.machine_patch)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, body))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"error": {"code": "AuthenticationFailed", "message": "bad token"}}, status=401)
        return await handler(request)  # type: ignore[no-any-return]

    def _take(self, kind: str, zone: str) -> bool | None:
        """None: the type is unknown there; False: out of capacity; True: one taken."""
        left = self.capacity.get((kind, zone))
        if left is None:
            return None
        if left <= 0:
            return False
        self.capacity[(kind, zone)] = left - 1
        return True

    # ---- Compute Engine ----------------------------------------------------------------------

    def _op(self, zone: str, kind: str, target: str, error: str = "") -> dict[str, Any]:
        op: dict[str, Any] = {"kind": "compute#operation", "name": f"operation-{next(self._ids)}", "zone": zone,
              "operationType": kind, "targetLink": f"https://compute/{zone}/instances/{target}", "status": "RUNNING"}
        if error:
            op["error"] = {"errors": [{"code": error, "message": f"{error} in {zone}"}]}
        self.gcp_ops[op["name"]] = op
        return op

    async def gcp_insert(self, request: web.Request) -> web.Response:
        zone, body = request.match_info["zone"], await request.json()
        name = body.get("name", "")
        kind = str(body.get("machineType", ""))
        if not kind.startswith(f"zones/{zone}/machineTypes/"):
            return _error(400, "invalid", f"Invalid value for field 'resource.machineType': '{kind}'", True)
        if not body.get("disks", [{}])[0].get("initializeParams", {}).get("sourceImage") or not body.get(
                "networkInterfaces"):
            return _error(400, "required", "a boot disk's sourceImage and a network interface are required", True)
        if body.get("scheduling", {}).get("provisioningModel") not in ("SPOT", "STANDARD"):
            return _error(400, "invalid", "scheduling.provisioningModel", True)
        if name in self.gcp:
            return _error(409, "alreadyExists", f"The resource '{name}' already exists", True)
        taken = self._take(kind.rsplit("/", 1)[-1], zone)
        if taken is None:
            return _error(400, "invalid", f"Invalid value for field 'resource.machineType': '{kind}'", True)
        if not taken:
            return web.json_response(self._op(zone, "insert", name, "ZONE_RESOURCE_POOL_EXHAUSTED"))
        self.gcp[name] = {"name": name, "zone": f"https://compute/zones/{zone}", "machineType": kind,
                          "status": "PROVISIONING", "labels": body.get("labels", {}),
                          "scheduling": body["scheduling"], "metadata": body.get("metadata", {})}
        return web.json_response(self._op(zone, "insert", name))

    async def gcp_op(self, request: web.Request) -> web.Response:
        op = self.gcp_ops.get(request.match_info["op"])
        if op is None:
            return _error(404, "notFound", "no such operation", True)
        op["status"] = "DONE"  # every operation ends by the time it is asked about
        return web.json_response(op)

    async def gcp_ops_list(self, request: web.Request) -> web.Response:
        zone = request.match_info["zone"]
        want = request.query.get("filter", "").partition("=")[2].strip('"')
        return web.json_response({"items": [o for o in self.gcp_ops.values()
                                            if o["zone"] == zone and (not want or o["operationType"] == want)]})

    async def gcp_get(self, request: web.Request) -> web.Response:
        found = self.gcp.get(request.match_info["name"])
        if found is None:
            return _error(404, "notFound", "The resource was not found", True)
        self._gcp_advance(found)
        return web.json_response(found)

    def _gcp_advance(self, instance: dict[str, Any]) -> None:
        """An instance moves on a state each time it is read (unless held): time passing, in a double."""
        if instance["status"] != "RUNNING" and not self.gcp_hold:
            instance["status"] = {"PROVISIONING": "STAGING", "STAGING": "RUNNING"}.get(instance["status"],
                                                                                        instance["status"])

    async def gcp_list(self, request: web.Request) -> web.Response:
        zone = request.match_info["zone"]
        key, _, value = request.query.get("filter", "").removeprefix("labels.").partition("=")
        items = [i for i in self.gcp.values()
                 if i["zone"].endswith(f"/{zone}") and (not key or i["labels"].get(key) == value)]
        for instance in items:
            self._gcp_advance(instance)
        return web.json_response({"items": items})

    async def gcp_delete(self, request: web.Request) -> web.Response:
        name, zone = request.match_info["name"], request.match_info["zone"]
        if self.gcp.pop(name, None) is None:
            return _error(404, "notFound", "The resource was not found", True)
        return web.json_response(self._op(zone, "delete", name))

    def gcp_preempt(self, name: str) -> None:
        """Compute Engine reclaims a spot instance (instanceTerminationAction DELETE)."""
        instance = self.gcp.pop(name)
        op = self._op(instance["zone"].rsplit("/", 1)[-1], "compute.instances.preempted", name)
        op["status"] = "DONE"

    # ---- Azure Resource Manager --------------------------------------------------------------

    async def az_put(self, request: web.Request) -> web.Response:
        name, body = request.match_info["name"], await request.json()
        if request.query.get("api-version") is None:
            return _error(400, "MissingApiVersionParameter", "The api-version query parameter is required", False)
        props = body.get("properties", {})
        size = props.get("hardwareProfile", {}).get("vmSize", "")
        if not body.get("location") or not size or not props.get("networkProfile") or not props.get(
                "storageProfile", {}).get("imageReference"):
            return _error(400, "InvalidParameter", "location, vmSize, an image and a network profile are required",
                          False)
        if props.get("priority") == "Spot" and props.get("evictionPolicy") not in ("Delete", "Deallocate"):
            return _error(400, "InvalidParameter", "a Spot VM needs an evictionPolicy", False)
        zone = f"{body['location']}-{(body.get('zones') or [''])[0]}"
        taken = self._take(size, zone)
        if taken is None:
            return _error(409, "SkuNotAvailable", f"The requested size {size} is not available in {zone}", False)
        self.azure[name] = {"name": name, "location": body["location"], "zones": body.get("zones", []),
                            "tags": body.get("tags", {}), "properties": {**props, "provisioningState": "Creating"},
                            "fails": not taken}
        return web.json_response(self._az_view(self.azure[name]), status=201)

    def _az_view(self, vm: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in vm.items() if k != "fails"}

    async def az_get(self, request: web.Request) -> web.Response:
        vm = self.azure.get(request.match_info["name"])
        if vm is None:
            return _error(404, "ResourceNotFound", "The Resource was not found", False)
        props = vm["properties"]
        if props["provisioningState"] == "Creating":
            props["provisioningState"] = "Failed" if vm["fails"] else "Succeeded"
            if vm["fails"]:
                props["instanceView"] = {"statuses": [{"code": "ProvisioningState/failed/ZonalAllocationFailed",
                                                       "message": "Allocation failed in the zone"}]}
        return web.json_response(self._az_view(vm))

    async def az_list(self, request: web.Request) -> web.Response:
        return web.json_response({"value": [self._az_view(vm) for vm in self.azure.values()]})

    async def az_delete(self, request: web.Request) -> web.Response:
        self.azure.pop(request.match_info["name"], None)
        return web.Response(status=202)

    # ---- Cluster API (kube-apiserver) --------------------------------------------------------

    def node_group(self, name: str, replicas: int = 0) -> None:
        self.deployments[name] = {"metadata": {"name": name, "namespace": "default"}, "spec": {"replicas": replicas}}
        self._reconcile(name)

    def _reconcile(self, group: str) -> None:
        """Cluster API's controller: as many machines as replicas; the marked ones go first."""
        mine = [m for m in self.machines.values() if m["metadata"]["labels"][GROUP] == group]
        want = self.deployments[group]["spec"]["replicas"]
        for _ in range(want - len(mine)):
            name = f"{group}-{next(self._ids)}"
            self.machines[name] = {"metadata": {"name": name, "labels": {GROUP: group}, "annotations": {}},
                                   "status": {"phase": "Provisioning"}}
        marked = sorted(mine, key=lambda m: DELETE not in m["metadata"]["annotations"])
        for machine in marked[:max(0, len(mine) - want)]:
            del self.machines[machine["metadata"]["name"]]

    def _advance(self) -> None:
        for machine in self.machines.values():
            group = machine["metadata"]["labels"][GROUP]
            if machine["status"]["phase"] == "Provisioning":
                if group in self.failing:
                    machine["status"] = {"phase": "Failed", "failureMessage": "InsufficientInstanceCapacity"}
                else:
                    machine["status"] = {"phase": "Running",
                                         "nodeRef": {"kind": "Node", "name": f"ip-{machine['metadata']['name']}"}}

    async def md_get(self, request: web.Request) -> web.Response:
        md = self.deployments.get(request.match_info["name"])
        if md is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(md)

    async def md_patch(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if request.content_type != "application/merge-patch+json":
            return web.json_response({"kind": "Status", "reason": "UnsupportedMediaType"}, status=415)
        if name not in self.deployments:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        replicas = (await request.json())["spec"]["replicas"]
        if not isinstance(replicas, int) or replicas < 0:
            return web.json_response({"kind": "Status", "reason": "Invalid", "code": 422}, status=422)
        self.deployments[name]["spec"]["replicas"] = replicas
        self._reconcile(name)
        return web.json_response(self.deployments[name])

    async def machines_list(self, request: web.Request) -> web.Response:
        self._advance()
        key, _, value = request.query.get("labelSelector", "").partition("=")
        return web.json_response({"items": [m for m in self.machines.values()
                                            if key in m["metadata"]["labels"]
                                            and (not value or m["metadata"]["labels"][key] == value)]})

    async def machine_patch(self, request: web.Request) -> web.Response:
        machine = self.machines.get(request.match_info["name"])
        if machine is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        machine["metadata"]["annotations"].update((await request.json())["metadata"]["annotations"])
        return web.json_response(machine)


GROUP = "cluster.x-k8s.io/deployment-name"
DELETE = "cluster.x-k8s.io/delete-machine"
