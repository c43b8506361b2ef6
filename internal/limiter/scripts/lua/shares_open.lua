-- Shares, opening: what each replica was granted in a window, kept beside the window's count,
-- so that counts a Redis lost (a failover to a replica that lagged, a restart without
-- persistence) are restored by the replicas that were granted them, exactly, and never counted
-- twice. It is not a script: scripts.go writes it in place of the line that includes it, in
-- the scripts of the window state (fixed_window.lua, sliding_window_counter.lua,
-- lease_return.lua), and shares_close.lua writes what it read. Inline rather than functions:
-- a script's local functions are closures made again on every call, and the closures alone
-- cost Redis about an eighth of a call.
--
-- The window state (see fixed_window.lua) holds, beside s, c and p, one field per replica that
-- was granted units in it, named by the replica's id: its share of one window, as
-- share * TAGS + (window index mod TAGS). A replica writes only its own field. Each call says
-- what the replica knows it was granted in the current window and the one before, and this
-- raises the state to it first: c by what this Redis lacks of the replica's share of the
-- current window, p by what it lacks of the previous one. The share becomes max(field, known),
-- so a repeat, or a replica whose knowledge is older than the field, adds nothing.
--
-- Why p needs only the field, not a second one: replication is in order, so a Redis that holds
-- a write of window k by a replica also holds everything of window k-1 (the roll to window k
-- came after it). p is incomplete only where the replica's field still names window k-1 or an
-- older one: then the field says what of its k-1 share reached this Redis. Once the replica
-- writes in window k here, its field names k and p is its concern no longer.
--
-- Lowerings: a settle, a give-back or a lease's return that gives units back lowers the
-- replica's share here and in the replica; a call of the same replica that read its share
-- before that, and runs after it, would find this Redis short of what it knows and restore what
-- went back. So a replica stamps each call with lv, its count of lowerings when it read the
-- share (from 1; 0: the caller keeps no stamps), and a lowering writes its own stamp in the
-- field ~<id>: a call stamped before the last lowering here restores nothing (its knowledge is
-- older than this Redis's, which is complete up to that lowering: replication is in order).
--
-- In: key, window, start (of the current window, ms on Redis's clock), now (ms), cost (0: the
-- call only restores and never waits), and the replica's part: id ('' keeps no share), lv, ms (the
-- start of the window m1 is its known share of), m1, m2 (its known share of the window before)
-- hold_ms (how long grants in the state wait once a share had to be restored in it, 0 for
-- not at all) and peers_seen (the most replicas of the limit the caller saw live lately, 0 for
-- unknown: a hold ends early once that many re-asserted here).
-- Out: kind (1 the state is this window's, 2 the previous window's, 3 none or older), cur and
-- prev (the counts, restored), had (a state of an older window is there), hold (until when
-- grants in the state wait, ms on Redis's clock; 0 for none), q (this window's
-- tag), mine (the replica's share of this window, restored), dcur and dprev (what was restored
-- to each window), restored (their sum), current (the replica's field names this window),
-- held (grants wait: a hold in force, or one this call starts by restoring), and what
-- shares_close.lua writes of the hold: hold_changed (s changes), marked (@<id> is written),
-- since, marks, peers.
local TAGS = 4096
local h
if id ~= '' and lv > 0 then
  h = redis.call('HMGET', key, 's', 'c', 'p', id, '~' .. id)
elseif id ~= '' then
  h = redis.call('HMGET', key, 's', 'c', 'p', id)
else
  h = redis.call('HMGET', key, 's', 'c', 'p')
end
local kind, cur, prev = 3, 0, 0
-- s is the window's start, or start:hold:since:marks:peers while grants wait (see below): the
-- hold rides on a field every call reads anyway, and one more field read costs every call.
local s, hold, since, marks, peers = tonumber(h[1]), 0, 0, 0, 0
if not s and h[1] and #h[1] <= 80 then
  local a, b, c, d, e = string.match(h[1], '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  s, hold, since, marks, peers = tonumber(a), tonumber(b) or 0, tonumber(c) or 0, tonumber(d) or 0, tonumber(e) or 0
end
if s == start then
  kind, cur, prev = 1, tonumber(h[2]) or 0, tonumber(h[3]) or 0
elseif s == start - window then
  kind, prev = 2, tonumber(h[2]) or 0
else
  hold = 0 -- a state of an older window holds nothing of these two
end
local had = h[1] ~= false
local q = (start / window) % TAGS
local mine, dcur, dprev, current, held = 0, 0, 0, false, false
-- carry: what a new window starts with beyond its restored share (FixedWindow's debt, set by
-- the script after this; 0 for every other).
local carry = 0
if id ~= '' then
  local held_cur, held_prev = 0, 0
  local f = tonumber(h[4])
  if f then
    local fq = f % TAGS
    if fq == q then
      -- A field naming this window in a state of another is a tag TAGS windows old.
      if kind == 1 then
        held_cur, current = (f - fq) / TAGS, true
      end
    elseif kind ~= 3 and fq == (q - 1) % TAGS then
      held_prev = (f - fq) / TAGS
    end
  end
  local known_cur, known_prev = 0, 0
  if ms == start then
    known_cur, known_prev = m1, m2
  elseif ms == start - window then
    known_prev = m1
  end
  if lv > 0 and (tonumber(h[5]) or 0) > lv then
    known_cur, known_prev = 0, 0 -- read before a lowering this Redis already has
  end
  if known_cur > held_cur then
    dcur = known_cur - held_cur
  end
  if not current and known_prev > held_prev then
    dprev = known_prev - held_prev
  end
  cur, prev, mine = cur + dcur, prev + dprev, held_cur + dcur
end
local restored = dcur + dprev

-- The hold: a replica that restored its share found this Redis short of what was granted here,
-- so the others' shares are likely missing too, and a grant before they re-assert theirs would
-- admit them again. Grants in the state wait until hold (ms on Redis's clock): the other
-- replicas hear of the loss within a heartbeat and re-assert; the hold outlasts that. It
-- carries over into the next window (its units were counted in p). It ends early once as
-- many replicas as the most any caller said were live lately (peers_seen) have called here
-- since it began (marks), each with its share restored: a replica is marked once per hold by
-- a field @<id> holding the hold's start (since).
local hold_changed, marked = false, false
if id ~= '' and (hold > now or (restored > 0 and hold_ms > 0)) then
  if hold <= now then
    since, marks, peers = now, 0, 0
  end
  if restored > 0 and hold_ms > 0 and now + hold_ms > hold then
    hold = now + hold_ms
  end
  if tonumber(redis.call('HGET', key, '@' .. id)) ~= since then
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
