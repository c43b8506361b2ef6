-- Dry run of calendar_window.lua: what a decision of cost units would answer now, counting
-- nothing. It reads what the decision reads and writes nothing (no key is created, changed or
-- given a TTL). KEYS and ARGV are calendar_window.lua's, and so is the reply; granted is the
-- cost the decision would count.
--!include calendar_open.lua
--!include calendar_refuse.lua
return {1, left - cost, 0, reset, now_us, cost}
