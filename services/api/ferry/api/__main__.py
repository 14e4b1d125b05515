from ferry.api.service import main

main()
