"""Helpers with no ZeRO in them, that every part may use; each imports nothing of zerompi but this folder.

    exit_codes.py    the documented exit codes
    inputs.py        reading what a user hands in: regular files only, sizes checked, one-line errors
    npz_members.py   an .npz archive's members, checked before they are read
    atomic.py        files written whole or not at all (a temporary name, fsync, rename)
    pipes.py         a closed stdout (| head) ends a command quietly
    words.py         counts and sizes in words: "3 ranks", "807.9 MB"
"""
