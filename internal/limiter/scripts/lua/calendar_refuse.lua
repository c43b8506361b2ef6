-- Fragment of peek_calendar_window.lua (included in place, see
-- scripts.go), after calendar_open.lua: answers every outcome of a dry run but a grant.
if cost > limit then
  return {0, left, -1, reset, now_us, 0}
elseif cost == 0 then
  return {1, left, 0, reset, now_us, 0}
elseif cur + cost > limit then
  return {0, left, reset, reset, now_us, 0}
end
