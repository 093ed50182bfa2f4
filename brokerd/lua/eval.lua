-- eval.lua — between prelude.lua and an operation's file in an EVAL script (tests; brokerd calls the
-- library's functions, which do the same): the call begins with Redis's KEYS and ARGV.
call_begin()
