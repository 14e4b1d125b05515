from ferry.autoscaler.service import main

main()
