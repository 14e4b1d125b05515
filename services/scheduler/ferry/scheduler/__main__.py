from ferry.scheduler.service import main

main()
