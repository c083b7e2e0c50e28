"""The extender verbs and time: ``filtering`` (which nodes a pod may use: for a gang member,
exactly its planned node), ``binding`` (park a member until its gang can bind, then let the
whole gang go) and ``deadlines`` (admitted gangs that time out, backoffs that end, sweeps).
Nothing below them calls them: the wings never decide a verb.
"""
