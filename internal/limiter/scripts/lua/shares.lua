-- Shares: what each replica was granted in a window, kept beside the window's count, so that
-- counts a Redis lost (a failover to a replica that lagged, a restart without persistence) are
-- restored by the replicas that were granted them, exactly, and never counted twice.
--
-- The window state (see fixed_window.lua) holds, beside s, c and p, one field per replica that
-- was granted units in it, named by the replica's id: its share of one window, as
-- share * TAGS + (window index mod TAGS). A replica writes only its own field. Each call says
-- what the replica knows it was granted in the current window and the one before (ARGV), and
-- this prologue raises the state to it first: c by what this Redis lacks of the replica's share
-- of the current window, p by what it lacks of the previous one. The share becomes
-- max(field, known), so a repeat, or a replica whose knowledge is older than the field, adds
-- nothing.
--
-- Why p needs only the field, not a second one: replication is in order, so a Redis that holds
-- a write of window k by a replica also holds everything of window k-1 (the roll to window k
-- came after it). p is incomplete only where the replica's field still names window k-1 or an
-- older one: then the field says what of its k-1 share reached this Redis. Once the replica
-- writes in window k here, its field names k and p is its concern no longer.
local TAGS = 4096

-- read_state returns the window state of key for the window starting at start, with what the
-- replica id knows of its shares (m1 units in the window starting at ms, m2 in the one before),
-- and what is to be restored.
local function read_state(key, window, start, id, ms, m1, m2)
  local h
  if id ~= '' then
    h = redis.call('HMGET', key, 's', 'c', 'p', id)
  else
    h = redis.call('HMGET', key, 's', 'c', 'p')
  end
  local st = {kind = 3, cur = 0, prev = 0, had = tonumber(h[1]) ~= nil, mine = 0, dcur = 0, dprev = 0}
  local s = tonumber(h[1])
  if s == start then
    st.kind, st.cur, st.prev = 1, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  elseif s == start - window then
    st.kind, st.prev = 2, tonumber(h[2]) or 0
  end
  if id == '' then
    return st
  end
  local q = (start / window) % TAGS
  local held_cur, held_prev, current = 0, 0, false
  local f = tonumber(h[4])
  if f then
    local fq = f % TAGS
    local fn = (f - fq) / TAGS
    if fq == q then
      -- A field naming this window in a state of another is a tag TAGS windows old.
      if st.kind == 1 then
        held_cur, current = fn, true
      end
    elseif fq == (q - 1) % TAGS and st.kind ~= 3 then
      held_prev = fn
    end
  end
  local known_cur, known_prev = 0, 0
  if ms == start then
    known_cur, known_prev = m1, m2
  elseif ms == start - window then
    known_prev = m1
  end
  st.dcur = math.max(known_cur - held_cur, 0)
  if not current then
    st.dprev = math.max(known_prev - held_prev, 0)
  end
  st.mine = held_cur + st.dcur
  st.cur, st.prev = st.cur + st.dcur, st.prev + st.dprev
  return st
end

-- write_state counts add more units (negative: gives them back) for the replica in the state
-- read_state returned, together with what it restored. The hash lives until the end of the next
-- window; a new window drops the fields of replicas that wrote none in the last two once there
-- are many, so a hot key outliving its replicas does not keep every id it ever saw.
local function write_state(key, st, window, start, elapsed, id, add)
  local mine = st.mine + add
  if st.kind == 1 then
    if st.dcur + add ~= 0 then
      redis.call('HINCRBY', key, 'c', st.dcur + add)
    end
    if st.dprev > 0 then
      redis.call('HINCRBY', key, 'p', st.dprev)
    end
    -- The field names this window once p is restored, so that p is restored once.
    if id ~= '' and (mine ~= st.mine - st.dcur or st.dprev > 0) then
      redis.call('HSET', key, id, mine * TAGS + (start / window) % TAGS)
    end
    return mine
  end
  if st.kind == 3 and st.had then
    redis.call('DEL', key) -- every field in it is from windows that ended
  end
  if id ~= '' then
    redis.call('HSET', key, 's', start, 'c', st.dcur + add, 'p', st.prev, id, mine * TAGS + (start / window) % TAGS)
  else
    redis.call('HSET', key, 's', start, 'c', st.dcur + add, 'p', st.prev)
  end
  redis.call('PEXPIRE', key, 2 * window - elapsed)
  if st.kind == 2 and redis.call('HLEN', key) > 35 then
    local q = (start / window) % TAGS
    local keep = {s = true, c = true, p = true}
    local all = redis.call('HGETALL', key)
    for i = 1, #all, 2 do
      local f, v = all[i], tonumber(all[i + 1])
      if not keep[f] and v and v % TAGS ~= q and v % TAGS ~= (q - 1) % TAGS then
        redis.call('HDEL', key, f)
      end
    end
  end
  return mine
end
