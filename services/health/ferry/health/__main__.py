from ferry.health.service import main

main()
