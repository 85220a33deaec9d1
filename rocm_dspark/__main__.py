from rocm_dspark.cli import main

main()
