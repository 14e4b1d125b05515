from ferry.pricing.service import main

main()
