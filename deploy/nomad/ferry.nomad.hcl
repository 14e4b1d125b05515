# Ferry's control plane: api, scheduler, health and pricing, one of each, in one group.
#
#   nomad var put nomad/jobs/ferry token="$(openssl rand -hex 32)"
#   nomad job run deploy/nomad/ferry.nomad.hcl
#
# Driver: docker, with the same image as the Kubernetes manifests (ghcr.io/ferry-project/ferry,
# built by deploy/Dockerfile), so nothing but Docker is needed on the clients and the control
# plane runs unprivileged as uid 10001. (raw_exec would work too, with Ferry installed on the host
# by ./setup.sh and command = "/path/to/.venv/bin/python".)
#
# Settings: the template below writes /local/ferry.yaml (FERRY_CONFIG); nats_url comes from the
# Nomad service "nats" (nats.nomad.hcl), the API token from the Nomad variable nomad/jobs/ferry.
# Probes: Nomad's own service checks can only be http or tcp, so the API gets a tcp check; with
# Consul (provider = "consul") add script checks that run `python -m ferry.<svc> --check`.

locals {
  image = "ghcr.io/ferry-project/ferry:0.1.0"

  ferry_config = <<-EOT
  nats_url: "{{ range $i, $s := nomadService "nats" }}{{ if $i }},{{ end }}nats://{{ $s.Address }}:{{ $s.Port }}{{ end }}"
  nats_replicas: 3
  heartbeat_interval_s: 1.0
  heartbeat_timeout_s: 5.0
  drain_timeout_s: 20
  otel_exporter: none
  log_level: INFO
  EOT
}

job "ferry" {
  type = "service"

  group "control" {
    count = 1

    network {
      port "grpc" {
        static = 7070
        to     = 7070
      }
    }

    service {
      name     = "ferry-api"
      provider = "nomad"
      port     = "grpc"
      task     = "api"

      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    restart {
      attempts = 10
      interval = "10m"
      delay    = "5s"
      mode     = "delay"
    }

    task "api" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s" # longer than drain_timeout_s

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.api"]
        ports   = ["grpc"]
      }

      env {
        FERRY_CONFIG = "/local/ferry.yaml"
        FERRY_ADDR   = "0.0.0.0:7070"
      }

      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      template {
        destination = "secrets/ferry.env"
        env         = true
        change_mode = "restart"
        data        = <<-EOT
        {{ with nomadVar "nomad/jobs/ferry" }}FERRY_TOKEN="{{ .token }}"{{ end }}
        EOT
      }

      resources {
        cpu    = 200
        memory = 256
      }
    }

    task "scheduler" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.scheduler"]
      }

      env {
        FERRY_CONFIG = "/local/ferry.yaml"
      }

      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 300
        memory = 512
      }
    }

    task "health" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.health"]
      }

      env {
        FERRY_CONFIG = "/local/ferry.yaml"
      }

      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 100
        memory = 192
      }
    }

    task "pricing" {
      driver       = "docker"
      user         = "10001"
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      config {
        image   = local.image
        command = "python"
        args    = ["-m", "ferry.pricing"]
      }

      env {
        FERRY_CONFIG = "/local/ferry.yaml"
      }

      template {
        destination = "local/ferry.yaml"
        data        = local.ferry_config
        change_mode = "restart"
      }

      resources {
        cpu    = 100
        memory = 192
      }
    }
  }
}
