-- Fragment of the calendar window's decision (calendar_window.lua; included in place, see
-- scripts.go), after calendar_open.lua: the replicas' shares of the period holding Redis's
-- clock, as shares_open.lua keeps them for windows that roll, so that counts a Redis lost (a
-- failover to a replica that lagged, a restart without persistence) are restored by the
-- replicas that were granted them, exactly, and never counted twice.
--
-- Each period's count (KEYS[i]) has a hash of its own beside it (KEYS[sk + i], expiring with it)
-- with one field per replica granted units in the period: its share, in units. A share names
-- its period by the key it is in, so it needs no window tag and nothing of the period before:
-- a period's count is only what was admitted in it. The call says what the replica knows it was
-- granted in the period starting at ms (m1), with its stamp lv (see shares_open.lua: a call read
-- before a lowering this Redis already has, ~<id>, restores nothing), and the count is first
-- raised by what this Redis lacks of it: max(field, known), so a repeat adds nothing.
--
-- The hold: as shares_open.lua's, on the field s of the hash (hold:since:marks:peers, absent
-- when grants do not wait), with a mark @<id> per replica that called during it.
--
-- In (set by the including script): sk, the index before the share hashes in KEYS; so, the
-- index before the replica's part in ARGV: id ('' keeps no share), ms, m1, (unused), hold_ms,
-- peers_seen, lv, as fixed_window.lua's ARGV[6..12].
-- Out: id, skey, mine (the replica's share, restored), restored, hold, since, marks, peers,
-- hold_changed, marked, held (grants wait), fresh (the replica has no field in the hash yet),
-- stamp (the replica's last lowering here, ~<id>), lv; cur and left restored.
local id = ARGV[so + 1] or ''
local ms, m1 = tonumber(ARGV[so + 2]) or 0, tonumber(ARGV[so + 3]) or 0
local hold_ms, peers_seen, lv = tonumber(ARGV[so + 5]) or 0, tonumber(ARGV[so + 6]) or 0, tonumber(ARGV[so + 7]) or 0
local skey = KEYS[sk + i]
-- Checked before anything is written, as calendar_open.lua's arguments.
if id ~= '' and not (skey and #id <= 100 and whole(ms, 0, 1e16) and whole(m1, 0, 1e15)
    and whole(hold_ms, 0, 1e9) and whole(peers_seen, 0, 1e6) and whole(lv, 0, 1e15)) then
  return redis.error_reply('ERR calendar shares: KEYS for the share hashes, an id of 100 bytes at most, and whole start, share, hold, peers and stamp')
end
local mine, restored, hold, since, marks, peers = 0, 0, 0, 0, 0, 0
local hold_changed, marked, held, fresh, stamp = false, false, false, false, 0
if id ~= '' then
  local h = redis.call('HMGET', skey, 's', id, '~' .. id)
  fresh = not h[2]
  if h[1] and #h[1] <= 80 then
    local a, c, d, e = string.match(h[1], '^(%d+):(%d+):(%d+):(%d+)$')
    hold, since, marks, peers = tonumber(a) or 0, tonumber(c) or 0, tonumber(d) or 0, tonumber(e) or 0
  end
  mine, stamp = tonumber(h[2]) or 0, tonumber(h[3]) or 0
  local known = 0
  if ms == b[i] and not (lv > 0 and stamp > lv) then
    known = m1
  end
  if known > mine then
    restored = known - mine
    cur, mine = cur + restored, known
  end
  if hold > now or (restored > 0 and hold_ms > 0) then
    if hold <= now then
      since, marks, peers = now, 0, 0
    end
    if restored > 0 and hold_ms > 0 and now + hold_ms > hold then
      hold = now + hold_ms
    end
    if tonumber(redis.call('HGET', skey, '@' .. id)) ~= since then
      marks, marked = marks + 1, true
    end
    if peers_seen > peers then
      peers = peers_seen
    end
    if peers > 0 and marks >= peers then
      hold = 0
    end
    hold_changed = true
  end
  if cost > 0 then
    held = hold > now
  end
end
left = math.max(limit - cur, 0)
