from ferry.checkpointer.service import main

main()
