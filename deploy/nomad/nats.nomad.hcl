# NATS with JetStream for Ferry: one server, its store on a host volume.
#
#   nomad job run deploy/nomad/nats.nomad.hcl
#
# Needs, on the client that runs it, a host volume in the client configuration:
#   client { host_volume "nats-data" { path = "/var/lib/nats" read_only = false } }
# and the docker driver. It registers the Nomad service "nats", which the Ferry jobs look up.
# For a NATS cluster run three of these (or NATS' own deployment) and set nats_url accordingly.

job "nats" {
  type = "service"

  group "nats" {
    count = 1

    network {
      port "client" {
        static = 4222
        to     = 4222
      }
      port "monitor" {
        to = 8222
      }
    }

    volume "data" {
      type      = "host"
      source    = "nats-data"
      read_only = false
    }

    service {
      name     = "nats"
      provider = "nomad"
      port     = "client"

      check {
        type     = "http"
        port     = "monitor"
        path     = "/healthz"
        interval = "10s"
        timeout  = "3s"
      }
    }

    task "nats" {
      driver = "docker"
      # nats-server enters lame-duck mode on SIGTERM and flushes JetStream to disk.
      kill_signal  = "SIGTERM"
      kill_timeout = "60s"

      config {
        image = "nats:2.11-alpine"
        ports = ["client", "monitor"]
        # The image's entrypoint prepends nats-server to arguments that start with "-".
        args = ["-js", "-sd", "/data", "--name", "nats-0", "-m", "8222"]
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
      }

      resources {
        cpu    = 500
        memory = 1024
      }
    }
  }
}
