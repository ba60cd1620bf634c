-- Argo CD health check for serving.kvpilot.io/InferenceEngine (Lua 5.1, as Argo CD's gopher-lua runs it).
-- Install: argocd-cm key resource.customizations.health.serving.kvpilot.io_InferenceEngine (docs/gitops.md).
-- It reads the operator's standard conditions: Degraded=True needs a person; a status older than the spec,
-- a build or a rollout is Progressing; Available=True with the engine ready is Healthy. The tuner's own
-- rollouts show as Progressing and then Healthy again: they never change spec, so Argo CD stays Synced.
hs = {}
local function condition(conditions, type_)
  for _, c in ipairs(conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
local generation = obj.metadata.generation or 0
if obj.status.observedGeneration == nil or obj.status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile generation " .. generation
  return hs
end
local conditions = obj.status.conditions
local degraded = condition(conditions, "Degraded")
local progressing = condition(conditions, "Progressing")
local available = condition(conditions, "Available")
local ready = condition(conditions, "EngineReady")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. (degraded.message or "")
  return hs
end
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = (progressing.reason or "Progressing") .. ": " .. (progressing.message or "")
  return hs
end
if progressing ~= nil and progressing.reason == "ProgressDeadlineExceeded" then
  hs.status = "Degraded"
  hs.message = "ProgressDeadlineExceeded: " .. (progressing.message or "")
  return hs
end
local engine_ready = ready ~= nil and ready.status == "True"
if engine_ready and available ~= nil and (available.status == "True" or available.reason == "ScaledToZero") then
  hs.status = "Healthy"
  hs.message = (available.reason or "Available") .. ": " .. (available.message or "")
  return hs
end
hs.status = "Progressing"
if available ~= nil then
  hs.message = (available.reason or "NotAvailable") .. ": " .. (available.message or "")
else
  hs.message = "Waiting for the engine to serve"
end
return hs
