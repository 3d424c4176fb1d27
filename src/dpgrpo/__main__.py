from dpgrpo.cli import main

main()
