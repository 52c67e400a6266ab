from specchat.entry import run

run()
