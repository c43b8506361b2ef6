-- Fragment of the calendar window's scripts that write (calendar_window.lua,
-- calendar_reserve.lua, calendar_settle.lua; included in place, see scripts.go), after
-- calendar_shares_open.lua, whose names it uses: counts add units (and what the opening
-- restored) in the period, and writes the replica's share and what changed of the hold. Both
-- keys expire at the period's end: a share of a period that ended holds nothing.
-- A negative add is a settle's give-back, at most mine and cur (restored): a lowering, which
-- stamps ~<id> with the call's lv (see calendar_shares_open.lua) unless a later one did.
if add + restored ~= 0 then
  redis.call('INCRBY', key, add + restored)
  redis.call('PEXPIREAT', key, b[i + 1])
end
if id ~= '' and (add ~= 0 or restored > 0 or hold_changed) then
  if add < 0 and lv > stamp then
    redis.call('HSET', skey, id, mine + add, '~' .. id, lv)
  elseif add ~= 0 or restored > 0 then
    redis.call('HSET', skey, id, mine + add)
  end
  if hold > now then
    redis.call('HSET', skey, 's', string.format('%d:%d:%d:%d', hold, since, marks, peers))
    if marked then
      redis.call('HSET', skey, '@' .. id, since)
    end
  elseif hold_changed then
    -- The hold ended early: it and its marks go (a listpack's worth at most is scanned, as in
    -- shares_close.lua; beyond it the marks go with the hash at the period's end).
    redis.call('HDEL', skey, 's')
    if redis.call('HLEN', skey) <= 128 then
      local all = redis.call('HGETALL', skey)
      for j = 1, #all, 2 do
        if string.sub(all[j], 1, 1) == '@' then
          redis.call('HDEL', skey, all[j])
        end
      end
    end
  end
  if fresh then
    -- The replica's first write in the period's hash: the hash may be new. Later writes find
    -- the expiry set (only a script writes the key), and a call that sets it again costs
    -- Redis a tenth more.
    redis.call('PEXPIREAT', skey, b[i + 1])
  end
end
