from ferry.migrator.service import main

main()
