"""Who calls the api, in one canonical form (`principals`), and who may read or change a service
(`access`: owner, administrators, grants).
"""
