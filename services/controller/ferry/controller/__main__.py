from ferry.controller.service import main

main()
