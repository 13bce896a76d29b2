"""The Lua scripts gateway/shared/state.py runs in Redis (each is one atomic round trip).

``INFLIGHT``: write one replica's in-flight snapshot unless a newer one (higher sequence number
from the same owner) is already there, refresh its expiry and the replica registry, and add
requests to per-second buckets: ARGV[6] names how many bucket keys follow the first two keys,
and ARGV[7 ..] the requests to add to each; the tiers' counts come after them.
``RATE_LIMIT``: an exact sliding-window log per key: a request costing ``cost`` units is allowed
when the units allowed in the last ``per`` seconds plus ``cost`` are at most ``limit``; answers
``{allowed, retry_after, remaining}``.
"""

INFLIGHT = """
local owner, seq = unpack(redis.call('HMGET', KEYS[1], '__owner', '__seq'))
if owner ~= ARGV[1] or tonumber(ARGV[2]) > tonumber(seq or '-1') then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], '__owner', ARGV[1], '__seq', ARGV[2], unpack(ARGV, 7 + ARGV[6]))
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[4])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[2], ARGV[3]) end
for i = 1, tonumber(ARGV[6]) do
  redis.call('INCRBY', KEYS[2 + i], ARGV[6 + i])
  redis.call('EXPIRE', KEYS[2 + i], ARGV[5])
end
return 1
"""
RATE_LIMIT = """
local now, per, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[5] or '1')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - per)
local count = redis.call('ZCARD', KEYS[1])
if count + cost <= limit then
  for i = 1, cost do redis.call('ZADD', KEYS[1], now, ARGV[4] .. ':' .. i) end
  redis.call('PEXPIRE', KEYS[1], math.ceil(per * 1000))
  return {1, '0', limit - count - cost}
end
local last = count + cost - limit - 1
local leaving = redis.call('ZRANGE', KEYS[1], last, last, 'WITHSCORES')
return {0, tostring(tonumber(leaving[2]) + per - now), 0}
"""
